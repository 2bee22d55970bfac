//! Plans a range over levels, exactly at any boundary: 30-day, day and hour
//! rollups (the last for minute buckets), then buckets and their values.
//!
//! The range is cut into pieces, one per point of the grid (a point of a
//! series, a cell of PromQL's windows). Each level answers the pieces it can
//! from its slots and hands the rest one level down:
//! - a piece, cut at the level's slot boundaries, is answered from a slot
//!   when it is the whole slot, the slot without its first second, or that
//!   second alone ([`Part`]): so a left-open PromQL window aligned to slots
//!   is answered from slots, never from the buckets at its edges;
//! - only a *complete* slot answers (see `store::rollup`: a slot is complete
//!   once its span has closed and been rolled up; a missing document or an
//!   incomplete slot is asked one level down, so an answer is exact whatever
//!   the upkeep has done so far);
//! - a slot over a bucket with readings not yet stored never answers: those
//!   readings are laid over the bucket at the bottom level.
//!
//! Levels are read one after another, each document at most once: the
//! engine reads a level for many series in one round trip. Pure: the caller
//! does the reading.

use std::collections::BTreeSet;

use super::Grid;
pub use super::ask::Ask;
use super::ask::{Tier, tiers};
pub use super::cell::{Cell, Need};
use crate::domain::{
    Agg, BucketRead, Granularity, Level, Part, RollupRead, Sample, Sketch, Summary, Values,
};

/// The sketches' accuracy unless [`Plan::with_accuracy`] says otherwise.
const DEFAULT_ACCURACY: f64 = 0.01;

/// Stored seconds `[from, to)` of point `cell` still to be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    from: i64,
    to: i64,
    cell: u32,
}

/// A piece asked of a rollup slot.
#[derive(Debug, Clone, Copy)]
struct Asked {
    doc: i64,
    piece: Piece,
    part: Part,
    /// Slot start.
    slot: i64,
    answered: bool,
}

/// The shared part of a query's plan: levels, range and grid.
#[derive(Debug, Clone)]
pub struct Plan {
    tiers: Vec<Tier>,
    need: Need,
    from: i64,
    to: i64,
    grid: Grid,
    /// With [`Need::Sketches`]: the sketches' relative accuracy.
    accuracy: f64,
}

/// Where one series is: the level it is at and what it still asks.
#[derive(Debug, Clone)]
pub struct SeriesPlan {
    tier: usize,
    pieces: Vec<Piece>,
    asked: Vec<Asked>,
    next: Vec<Piece>,
    /// Starts of buckets with readings not stored yet, sorted.
    dirty: Vec<i64>,
    aggs: Vec<Agg>,
    /// With [`Need::Summaries`]: each point's pieces, merged in time order at the end.
    summaries: Vec<Vec<Summary>>,
    /// With [`Need::Values`]: each point's readings.
    samples: Vec<Vec<Sample>>,
    /// With [`Need::Sketches`]: each point's sketch so far.
    sketches: Vec<Option<Sketch>>,
}

impl Plan {
    /// Stored seconds `s` with `from <= s < to` count, in the points of `grid`.
    pub fn new(granularity: Granularity, need: Need, from: i64, to: i64, grid: Grid) -> Self {
        let mut tiers = tiers(granularity);
        if need == Need::Values {
            // Rollups summarize; only buckets keep each reading.
            tiers.retain(|t| t.level == Level::Buckets);
        }
        Self {
            tiers,
            need,
            from,
            to,
            grid,
            accuracy: DEFAULT_ACCURACY,
        }
    }

    /// The plan with sketches of relative accuracy `accuracy` (the one
    /// rollup slots keep theirs at: others are not used).
    pub fn with_accuracy(mut self, accuracy: f64) -> Self {
        self.accuracy = accuracy;
        self
    }

    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    pub fn need(&self) -> Need {
        self.need
    }

    /// The length of the documents of `level`.
    pub fn len_of(&self, level: Level) -> i64 {
        self.tiers
            .iter()
            .find(|t| t.level == level)
            .map_or(1, |t| t.len)
    }

    /// The stored seconds point `i` covers, clipped to the range.
    pub fn cell_range(&self, i: usize) -> Option<(i64, i64)> {
        let a = self.grid.start(i)?;
        let b = self.grid.start(i + 1).unwrap_or(i64::MAX);
        let (a, b) = (a.max(self.from), b.min(self.to));
        (a < b).then_some((a, b))
    }

    /// Whether any of `dirty` (sorted bucket starts) holds seconds of `[from, to)`.
    pub fn any_dirty(&self, dirty: &[i64], from: i64, to: i64) -> bool {
        let first = dirty.partition_point(|&d| d + self.bucket_len() <= from);
        dirty.get(first).is_some_and(|&d| d < to)
    }

    fn bucket_len(&self) -> i64 {
        self.tiers[self.tiers.len() - 1].len
    }

    /// A series' plan; `dirty`: starts of its buckets with unstored readings.
    pub fn start(&self, dirty: &[i64]) -> SeriesPlan {
        self.start_from(dirty, 0)
    }

    /// A series' plan that leaves its first `known` points unanswered (the
    /// caller has them already).
    pub fn start_from(&self, dirty: &[i64], known: usize) -> SeriesPlan {
        let mut dirty = dirty.to_vec();
        dirty.sort_unstable();
        dirty.dedup();
        let points = self.grid.points();
        let mut pieces = Vec::with_capacity(points);
        if self.from < self.to {
            for i in known..points {
                let (Some(a), end) = (self.grid.start(i), self.grid.start(i + 1)) else {
                    continue;
                };
                let b = end.unwrap_or(i64::MAX);
                let (a, b) = (a.max(self.from), b.min(self.to));
                if a < b {
                    pieces.push(Piece {
                        from: a,
                        to: b,
                        cell: i as u32,
                    });
                }
            }
        }
        SeriesPlan {
            tier: 0,
            pieces,
            asked: Vec::new(),
            next: Vec::new(),
            dirty,
            aggs: vec![Agg::default(); points],
            summaries: match self.need {
                Need::Summaries => vec![Vec::new(); points],
                _ => Vec::new(),
            },
            samples: match self.need {
                Need::Values => vec![Vec::new(); points],
                _ => Vec::new(),
            },
            sketches: match self.need {
                Need::Sketches => vec![None; points],
                _ => Vec::new(),
            },
        }
    }

    fn dirty_inside(&self, s: &SeriesPlan, from: i64, to: i64) -> bool {
        let first = s.dirty.partition_point(|&d| d + self.bucket_len() <= from);
        s.dirty.get(first).is_some_and(|&d| d < to)
    }

    /// What the series asks of its next level, if it still asks anything.
    /// Levels with nothing to ask are skipped.
    pub fn ask(&self, s: &mut SeriesPlan) -> Option<Ask> {
        while s.tier < self.tiers.len() && !s.pieces.is_empty() {
            let tier = self.tiers[s.tier];
            let ask = if tier.level == Level::Buckets {
                self.ask_buckets(s, tier)
            } else {
                self.ask_rollups(s, tier)
            };
            if let Some(ask) = ask {
                return Some(ask);
            }
            // Nothing answerable at this level: everything goes down.
            s.pieces = std::mem::take(&mut s.next);
            s.tier += 1;
        }
        None
    }

    fn ask_rollups(&self, s: &mut SeriesPlan, tier: Tier) -> Option<Ask> {
        s.asked.clear();
        s.next.clear();
        let pieces = std::mem::take(&mut s.pieces);
        for p in &pieces {
            let mut u = p.from - p.from.rem_euclid(tier.slot);
            while u < p.to {
                let (a, b) = (p.from.max(u), p.to.min(u + tier.slot));
                let piece = Piece {
                    from: a,
                    to: b,
                    cell: p.cell,
                };
                match Part::of(u, u + tier.slot, a, b) {
                    Some(part) if !self.dirty_inside(s, u, u + tier.slot) => s.asked.push(Asked {
                        doc: u - u.rem_euclid(tier.len),
                        piece,
                        part,
                        slot: u,
                        answered: false,
                    }),
                    _ => s.next.push(piece),
                }
                u += tier.slot;
            }
        }
        if s.asked.is_empty() {
            return None;
        }
        s.asked.sort_by_key(|a| a.doc);
        let mut starts: Vec<i64> = s.asked.iter().map(|a| a.doc).collect();
        starts.dedup();
        Some(Ask {
            level: tier.level,
            starts,
            values: Values::None,
            minutes: false,
        })
    }

    fn ask_buckets(&self, s: &mut SeriesPlan, tier: Tier) -> Option<Ask> {
        s.next.clear();
        let mut starts = BTreeSet::new();
        let mut minutes = BTreeSet::new();
        let mut all_values = false;
        let mut use_minutes = false;
        let mut pieces = Vec::with_capacity(s.pieces.len());
        for p in std::mem::take(&mut s.pieces) {
            let mut b = p.from - p.from.rem_euclid(tier.len);
            while b < p.to {
                starts.insert(b);
                let dirty = self.dirty_inside(s, b, b + tier.len);
                if tier.slot == 0 || dirty {
                    all_values = true;
                } else {
                    // Hour buckets: whole minutes from `m` when aggregates
                    // do, the values of the others.
                    let (a, z) = (p.from.max(b), p.to.min(b + tier.len));
                    let mut m = a - a.rem_euclid(tier.slot);
                    while m < z {
                        let whole = a <= m && m + tier.slot <= z;
                        if whole && self.need == Need::Aggregates {
                            use_minutes = true;
                        } else {
                            minutes.insert(((m - b) / tier.slot) as u16);
                        }
                        m += tier.slot;
                    }
                }
                b += tier.len;
            }
            pieces.push(p);
        }
        s.pieces = pieces;
        s.pieces.sort_by_key(|p| p.from);
        let values = if all_values {
            Values::All
        } else if minutes.is_empty() {
            Values::None
        } else {
            Values::Minutes(minutes.into_iter().collect())
        };
        Some(Ask {
            level: tier.level,
            starts: starts.into_iter().collect(),
            values,
            minutes: use_minutes,
        })
    }

    /// Answers what a rollup document read for the series' current level can.
    pub fn answer_rollup(&self, s: &mut SeriesPlan, doc: &RollupRead) {
        let tier = self.tiers[s.tier];
        let first = s.asked.partition_point(|a| a.doc < doc.start);
        for i in first..s.asked.len() {
            let a = s.asked[i];
            if a.doc != doc.start {
                break;
            }
            let k = ((a.slot - a.doc) / tier.slot) as u16;
            if !doc.is_complete(k) {
                continue;
            }
            let slot = doc.slot(a.slot);
            if self.need == Need::Sketches {
                // A slot with readings but no sketch answers one level down.
                match slot {
                    Some(slot) if slot.sketch.is_none() => continue,
                    Some(slot) => {
                        if let Some(k) = slot.sketch_part(a.part) {
                            self.add_sketch(s, a.piece.cell, &k);
                        }
                    }
                    None => {}
                }
            }
            s.asked[i].answered = true;
            if let Some(summary) = slot.and_then(|slot| slot.part(a.part)) {
                self.add(s, a.piece.cell, &summary);
            }
        }
    }

    /// Answers from a bucket read for the series' bottom level, its values
    /// already laid under the readings not stored yet (see
    /// [`Self::dirty_starts`]).
    pub fn answer_bucket(&self, s: &mut SeriesPlan, b: &BucketRead) {
        let tier = self.tiers[s.tier];
        let end = b.start + tier.len;
        let dirty = self.dirty_inside(s, b.start, end);
        let first = s.pieces.partition_point(|p| p.to <= b.start);
        let mut samples: Vec<Sample> = Vec::new();
        for i in first..s.pieces.len() {
            let p = s.pieces[i];
            if p.from >= end {
                break;
            }
            let (a, z) = (p.from.max(b.start), p.to.min(end));
            let from_minutes = |m: i64| {
                tier.slot > 0
                    && !dirty
                    && self.need == Need::Aggregates
                    && a <= m
                    && m + tier.slot <= z
            };
            if tier.slot > 0 && !dirty && self.need == Need::Aggregates {
                for &(minute, ref agg) in &b.slots {
                    let m = b.start + i64::from(minute) * tier.slot;
                    if from_minutes(m) {
                        s.aggs[p.cell as usize].merge(agg);
                    }
                }
            }
            samples.clear();
            for &(offset, v) in &b.values {
                let t = b.start + i64::from(offset);
                let m = t - (t - b.start).rem_euclid(tier.slot.max(1));
                if t >= a && t < z && !from_minutes(m) && t >= self.from && t < self.to {
                    samples.push(Sample { t, v });
                }
            }
            match self.need {
                Need::Aggregates => {
                    for x in &samples {
                        s.aggs[p.cell as usize].add(x.v);
                    }
                }
                Need::Sketches => {
                    let cell = p.cell as usize;
                    if s.sketches[cell].is_none() && !samples.is_empty() {
                        s.sketches[cell] = Sketch::new(self.accuracy).ok();
                    }
                    for x in &samples {
                        s.aggs[cell].add(x.v);
                        if let Some(k) = &mut s.sketches[cell] {
                            k.add(x.v);
                        }
                    }
                }
                Need::Summaries => {
                    if let Some(summary) = Summary::of(&samples) {
                        self.add(s, p.cell, &summary);
                    }
                }
                Need::Values => s.samples[p.cell as usize].extend_from_slice(&samples),
            }
        }
    }

    /// Merges a slot's sketch into the point's: the store decodes only
    /// sketches of the plan's accuracy, so they always merge.
    fn add_sketch(&self, s: &mut SeriesPlan, cell: u32, k: &Sketch) {
        match &mut s.sketches[cell as usize] {
            Some(all) => {
                let merged = all.merge(k);
                debug_assert!(merged.is_ok(), "sketches of the plan's accuracy");
            }
            none => *none = Some(k.clone()),
        }
    }

    fn add(&self, s: &mut SeriesPlan, cell: u32, summary: &Summary) {
        match self.need {
            Need::Aggregates | Need::Sketches => s.aggs[cell as usize].merge(&summary.agg()),
            Need::Summaries => s.summaries[cell as usize].push(*summary),
            // Never asked of rollups (see `Plan::new`).
            Need::Values => {}
        }
    }

    /// After every document of the current level was answered: what none
    /// answered goes one level down.
    pub fn advance(&self, s: &mut SeriesPlan) {
        if self
            .tiers
            .get(s.tier)
            .is_some_and(|t| t.level == Level::Buckets)
        {
            // The bottom: a bucket not read holds no readings.
            s.pieces.clear();
        } else {
            let unanswered = s.asked.iter().filter(|a| !a.answered).map(|a| a.piece);
            s.next.extend(unanswered);
            s.next.sort_by_key(|p| p.from);
            s.pieces = std::mem::take(&mut s.next);
            s.asked.clear();
        }
        s.tier += 1;
    }

    /// The bucket starts with readings not stored yet that the bottom level
    /// reads: the caller lays those readings over them (and answers the ones
    /// with nothing stored as an empty bucket).
    pub fn dirty_starts(&self, s: &SeriesPlan, ask: &Ask) -> Vec<i64> {
        s.dirty
            .iter()
            .copied()
            .filter(|d| ask.starts.binary_search(d).is_ok())
            .collect()
    }

    /// Every point, answered.
    pub fn finish(&self, s: SeriesPlan) -> Vec<Cell> {
        match self.need {
            Need::Aggregates => s
                .aggs
                .into_iter()
                .map(|agg| Cell {
                    agg,
                    ..Cell::default()
                })
                .collect(),
            Need::Sketches => s
                .aggs
                .into_iter()
                .zip(s.sketches)
                .map(|(agg, sketch)| Cell {
                    agg,
                    sketch,
                    ..Cell::default()
                })
                .collect(),
            Need::Summaries => s
                .summaries
                .into_iter()
                .map(|mut pieces| {
                    pieces.sort_by_key(|p| p.first.t);
                    let summary = pieces.iter().copied().reduce(|a, b| a.then(&b));
                    Cell {
                        agg: summary.as_ref().map(Summary::agg).unwrap_or_default(),
                        summary,
                        ..Cell::default()
                    }
                })
                .collect(),
            Need::Values => s
                .samples
                .into_iter()
                .map(|mut samples| {
                    samples.sort_by_key(|x| x.t);
                    let summary = Summary::of(&samples);
                    Cell {
                        agg: summary.as_ref().map(Summary::agg).unwrap_or_default(),
                        summary,
                        samples,
                        sketch: None,
                    }
                })
                .collect(),
        }
    }
}

impl SeriesPlan {
    /// Whether the series has nothing left to ask.
    pub fn is_done(&self) -> bool {
        self.pieces.is_empty() && self.next.is_empty() && self.asked.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::grid::Calendar;
    use super::*;
    use crate::domain::{Period, Slot, Starts};
    use jiff::tz::TimeZone;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// What a store would hold for some readings: buckets with values and
    /// minute aggregates, and rollup documents of every level, some of them
    /// missing and some slots incomplete (and then wrong: never to be used).
    struct Model {
        g: Granularity,
        buckets: BTreeMap<i64, BucketRead>,
        rollups: BTreeMap<(Period, i64), RollupRead>,
    }

    impl Model {
        fn new(g: Granularity, stored: &BTreeMap<i64, f64>, holes: u64) -> Self {
            let mut buckets: BTreeMap<i64, BucketRead> = BTreeMap::new();
            for (&t, &v) in stored {
                let start = g.bucket_start(t);
                let b = buckets.entry(start).or_insert_with(|| BucketRead {
                    start,
                    ..BucketRead::default()
                });
                b.values.push(((t - start) as u16, v));
                b.agg.add(v);
                if g == Granularity::Hour {
                    let m = ((t - start) / 60) as u16;
                    match b.slots.iter_mut().find(|(k, _)| *k == m) {
                        Some((_, a)) => a.add(v),
                        None => {
                            let mut a = Agg::default();
                            a.add(v);
                            b.slots.push((m, a));
                        }
                    }
                }
            }
            for b in buckets.values_mut() {
                b.slots.sort_by_key(|&(k, _)| k);
            }
            let mut rollups = BTreeMap::new();
            let mut dice = holes.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut roll = move || {
                dice ^= dice << 13;
                dice ^= dice >> 7;
                dice ^= dice << 17;
                dice % 8
            };
            let (Some(&first), Some(&last)) = (stored.keys().next(), stored.keys().last()) else {
                return Self {
                    g,
                    buckets,
                    rollups,
                };
            };
            for &p in Period::levels(g) {
                let mut start = first - first.rem_euclid(p.seconds());
                while start <= last {
                    // Sometimes no document at all.
                    if holes > 0 && roll() == 0 {
                        start += p.seconds();
                        continue;
                    }
                    let mut doc = RollupRead {
                        start,
                        ..RollupRead::default()
                    };
                    for k in 0..p.seconds() / p.slot_seconds() {
                        let s = start + k * p.slot_seconds();
                        let samples: Vec<Sample> = stored
                            .range(s..s + p.slot_seconds())
                            .map(|(&t, &v)| Sample { t, v })
                            .collect();
                        if holes > 0 && roll() == 0 {
                            // Incomplete, and stale: a wrong figure that must
                            // never be used.
                            let wrong = [Sample { t: s, v: 1e6 }];
                            doc.slots
                                .push(Slot::of(s, &wrong, 1).sketched(DEFAULT_ACCURACY, &wrong));
                            continue;
                        }
                        doc.complete |= 1 << k;
                        if !samples.is_empty() {
                            let slot = Slot::of(s, &samples, 1);
                            // Sometimes kept without a sketch (stored before
                            // sketches were, or at another accuracy).
                            doc.slots.push(if holes > 0 && roll() == 0 {
                                slot
                            } else {
                                slot.sketched(DEFAULT_ACCURACY, &samples)
                            });
                        }
                    }
                    rollups.insert((p, start), doc);
                    start += p.seconds();
                }
            }
            Self {
                g,
                buckets,
                rollups,
            }
        }

        fn starts(ask: &Ask, len: i64) -> Vec<i64> {
            ask.reads(len)
                .into_iter()
                .flat_map(|r| match r {
                    Starts::Range(a, b) => (a..b).step_by(len as usize).collect(),
                    Starts::Only(v) => v,
                })
                .collect()
        }
    }

    /// Plans, reads from the model, lays unstored readings over their
    /// buckets, answers; also counts the documents read.
    fn answer(
        g: Granularity,
        need: Need,
        from: i64,
        to: i64,
        grid: Grid,
        model: &Model,
        unstored: &BTreeMap<i64, f64>,
    ) -> (Vec<Cell>, usize) {
        let dirty: Vec<i64> = unstored.keys().map(|&t| g.bucket_start(t)).collect();
        let plan = Plan::new(g, need, from, to, grid);
        let mut s = plan.start(&dirty);
        let mut documents = 0;
        while let Some(ask) = plan.ask(&mut s) {
            let len = plan.len_of(ask.level);
            let wanted = Model::starts(&ask, len);
            match ask.level {
                Level::Rollups(p) => {
                    for start in wanted {
                        if let Some(doc) = model.rollups.get(&(p, start)) {
                            documents += 1;
                            plan.answer_rollup(&mut s, doc);
                        }
                    }
                }
                Level::Buckets => {
                    let dirty = plan.dirty_starts(&s, &ask);
                    for start in wanted {
                        let stored = model.buckets.get(&start);
                        documents += usize::from(stored.is_some());
                        let mut b = stored.cloned().unwrap_or_else(|| BucketRead {
                            start,
                            ..BucketRead::default()
                        });
                        if !ask.minutes {
                            b.slots.clear();
                        }
                        if let Values::Minutes(ms) = &ask.values {
                            b.values.retain(|(o, _)| ms.contains(&(o / 60)));
                        }
                        if ask.values == Values::None {
                            b.values.clear();
                        }
                        if dirty.contains(&start) {
                            let mut values: BTreeMap<u16, f64> = stored
                                .map(|b| b.values.iter().copied().collect())
                                .unwrap_or_default();
                            for (&t, &v) in unstored.range(start..start + model.g.seconds()) {
                                values.insert((t - start) as u16, v);
                            }
                            b.values = values.into_iter().collect();
                        } else if stored.is_none() {
                            continue;
                        }
                        plan.answer_bucket(&mut s, &b);
                    }
                }
            }
            plan.advance(&mut s);
        }
        (plan.finish(s), documents)
    }

    fn brute_force(
        grid: &Grid,
        from: i64,
        to: i64,
        stored: &BTreeMap<i64, f64>,
        unstored: &BTreeMap<i64, f64>,
    ) -> Vec<Cell> {
        let mut all = stored.clone();
        all.extend(unstored.iter().map(|(&k, &v)| (k, v)));
        let mut samples = vec![Vec::new(); grid.points()];
        for (&t, &v) in all.range(from..to) {
            if let Some(p) = grid.point(t) {
                samples[p].push(Sample { t, v });
            }
        }
        samples
            .into_iter()
            .map(|xs| {
                let summary = Summary::of(&xs);
                let sketch = (!xs.is_empty()).then(|| {
                    let mut k = Sketch::new(DEFAULT_ACCURACY).expect("valid");
                    for x in &xs {
                        k.add(x.v);
                    }
                    k
                });
                Cell {
                    agg: summary.as_ref().map(Summary::agg).unwrap_or_default(),
                    summary,
                    samples: xs,
                    sketch,
                }
            })
            .collect()
    }

    fn check(got: &[Cell], want: &[Cell], need: Need) -> Result<(), TestCaseError> {
        prop_assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            prop_assert_eq!(g.agg, w.agg);
            if need == Need::Values {
                prop_assert_eq!(&g.samples, &w.samples);
            }
            if need == Need::Sketches {
                prop_assert_eq!(&g.sketch, &w.sketch);
            }
            if matches!(need, Need::Summaries | Need::Values) {
                let key = |c: &Cell| {
                    c.summary
                        .map(|s| (s.first, s.last, s.penult, s.inc, s.resets, s.changes))
                };
                prop_assert_eq!(key(g), key(w));
            }
        }
        Ok(())
    }

    fn granularity() -> impl Strategy<Value = Granularity> {
        prop_oneof![Just(Granularity::Minute), Just(Granularity::Hour)]
    }

    fn need() -> impl Strategy<Value = Need> {
        prop_oneof![
            Just(Need::Aggregates),
            Just(Need::Summaries),
            Just(Need::Values),
            Just(Need::Sketches)
        ]
    }

    const DAY: i64 = 86_400;
    /// 2026-03-01: the data spans both spring daylight-saving changes.
    const BASE: i64 = 1_772_323_200;

    /// Readings, often on the first second of a minute, hour or day (where
    /// left-open windows cut), split into stored and unstored.
    fn data(span: i64) -> impl Strategy<Value = BTreeMap<i64, i32>> {
        let t = prop_oneof![
            BASE..BASE + span,
            (0..span / 60).prop_map(|k| BASE + k * 60),
            (0..span / 3600).prop_map(|k| BASE + k * 3600),
            (0..span / DAY).prop_map(|k| BASE + k * DAY),
        ];
        prop::collection::btree_map(t, -100i32..100, 0..300)
    }

    fn split(
        data: BTreeMap<i64, i32>,
        unstored_every: usize,
    ) -> (BTreeMap<i64, f64>, BTreeMap<i64, f64>) {
        let mut stored = BTreeMap::new();
        let mut unstored = BTreeMap::new();
        for (i, (ts, v)) in data.into_iter().enumerate() {
            if unstored_every > 0 && i % unstored_every == 0 {
                unstored.insert(ts, f64::from(v));
                // Sometimes an older stored value under the newer one.
                if i % 2 == 0 {
                    stored.insert(ts, f64::from(v) - 7.0);
                }
            } else {
                stored.insert(ts, f64::from(v));
            }
        }
        (stored, unstored)
    }

    /// PromQL's cells: windows `(t − range, t]` at `start + k·step` become
    /// the whole seconds `(t − range, t]`, cut where any window starts or ends.
    fn window_grid(start: i64, step: i64, n: i64, range: i64) -> Grid {
        let mut bounds: Vec<i64> = (0..n)
            .flat_map(|k| {
                let t = start + k * step;
                [t - range + 1, t + 1]
            })
            .collect();
        bounds.sort_unstable();
        bounds.dedup();
        Grid::Bounds(bounds)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn averages_equal_brute_force_at_any_boundary(
            g in granularity(),
            need in need(),
            data in data(40 * DAY),
            from in BASE..BASE + 40 * DAY,
            len in prop_oneof![1i64..4 * 3600, 1i64..40 * DAY],
            unstored_every in prop_oneof![Just(0usize), 3usize..40],
            holes in 0u64..4,
        ) {
            let (stored, unstored) = split(data, unstored_every);
            let to = from + len;
            let grid = Grid::whole(from, to);
            let model = Model::new(g, &stored, holes);
            let (got, _) = answer(g, need, from, to, grid.clone(), &model, &unstored);
            check(&got, &brute_force(&grid, from, to, &stored, &unstored), need)?;
        }

        #[test]
        fn fixed_step_series_equal_brute_force(
            g in granularity(),
            need in need(),
            data in data(3 * DAY),
            from in BASE..BASE + 3 * DAY,
            len in 1i64..3 * DAY,
            step_minutes in prop_oneof![Just(1i64), Just(5), Just(7), Just(60), Just(90), Just(1440)],
            unstored_every in prop_oneof![Just(0usize), 3usize..40],
            holes in 0u64..4,
        ) {
            let (stored, unstored) = split(data, unstored_every);
            let to = from + len;
            let grid = Grid::aligned(from, to, step_minutes * 60);
            let model = Model::new(g, &stored, holes);
            let (got, _) = answer(g, need, from, to, grid.clone(), &model, &unstored);
            check(&got, &brute_force(&grid, from, to, &stored, &unstored), need)?;
        }

        #[test]
        fn promql_windows_equal_brute_force(
            g in granularity(),
            data in data(10 * DAY),
            aligned in any::<bool>(),
            start_k in 0i64..100,
            step in prop_oneof![Just(60i64), Just(300), Just(3600), Just(DAY), 1i64..5000],
            n in 1i64..60,
            range_steps in 1i64..4,
            unstored_every in prop_oneof![Just(0usize), 3usize..40],
            holes in 0u64..4,
        ) {
            let (stored, unstored) = split(data, unstored_every);
            let start = if aligned {
                BASE + start_k * step
            } else {
                BASE + start_k * 997 + 13
            };
            let grid = window_grid(start, step, n, range_steps * step);
            let Grid::Bounds(b) = &grid else { unreachable!() };
            let (from, to) = (b[0], b[b.len() - 1]);
            let model = Model::new(g, &stored, holes);
            let want = brute_force(&grid, from, to, &stored, &unstored);
            for need in [Need::Summaries, Need::Sketches] {
                let (got, _) = answer(g, need, from, to, grid.clone(), &model, &unstored);
                check(&got, &want, need)?;
            }
        }

        #[test]
        fn calendar_series_in_time_zones_equal_brute_force(
            g in granularity(),
            data in data(70 * DAY),
            from in BASE..BASE + 70 * DAY,
            len in 1i64..70 * DAY,
            step in prop_oneof![Just(Calendar::Day), Just(Calendar::Week), Just(Calendar::Month)],
            zone in prop_oneof![
                Just("UTC"), Just("Europe/Berlin"), Just("America/New_York"),
                Just("Asia/Kolkata"), Just("Australia/Lord_Howe"), Just("America/St_Johns"),
            ],
            unstored_every in prop_oneof![Just(0usize), 5usize..40],
            holes in 0u64..4,
        ) {
            let (stored, unstored) = split(data, unstored_every);
            let to = from + len;
            let tz = TimeZone::get(zone).expect("bundled");
            let grid = Grid::calendar(from, to, step, &tz, 10_000).expect("grid");
            let model = Model::new(g, &stored, holes);
            let (got, _) = answer(g, Need::Aggregates, from, to, grid.clone(), &model, &unstored);
            check(&got, &brute_force(&grid, from, to, &stored, &unstored), Need::Aggregates)?;
        }
    }

    /// Equal but for the moments' rounding (their sums run in another order).
    fn same(got: &[Cell], want: &[Cell]) {
        if let Err(e) = check(got, want, Need::Summaries) {
            panic!("{e}");
        }
    }

    /// A reading every `every` seconds for `days` days.
    fn dense(from: i64, days: i64, every: i64) -> BTreeMap<i64, f64> {
        (0..days * DAY / every)
            .map(|i| (from + i * every, (i % 17) as f64))
            .collect()
    }

    #[test]
    fn documents_read_do_not_grow_with_the_range() {
        let none = BTreeMap::new();
        let from = BASE + 3 * 3600 + 17 * 60 + 13;
        for (g, every) in [(Granularity::Minute, 290), (Granularity::Hour, 1790)] {
            let model = Model::new(g, &dense(BASE, 402, every), 0);
            for days in [1, 7, 30, 60, 400] {
                let to = from + days * DAY - 3600 - 120 - 7;
                let grid = Grid::whole(from, to);
                let (got, read) = answer(g, Need::Summaries, from, to, grid.clone(), &model, &none);
                let stored = dense(BASE, 402, every);
                same(&got, &brute_force(&grid, from, to, &stored, &none));
                // The thirty-day documents inside, plus at most two
                // documents of each level at the edges.
                let whole = ((to - from) / Period::Days30.seconds()) as usize;
                let edges = 2 * (Period::levels(g).len() + 1);
                assert!(read <= whole + edges, "{g:?} {days} d: {read} documents");
            }
        }
    }

    /// A Grafana panel: windows as long as the step, the start aligned to it.
    #[test]
    fn aligned_panels_read_about_one_document_per_day_or_thirty() {
        let none = BTreeMap::new();
        for g in [Granularity::Minute, Granularity::Hour] {
            let stored = dense(BASE, 402, 600);
            let model = Model::new(g, &stored, 0);
            // 1 h steps over 30 days: one day document per day (plus the ends).
            let days = 30;
            let start = BASE + 5 * DAY;
            let grid = window_grid(start, 3600, days * 24, 3600);
            let Grid::Bounds(b) = &grid else {
                unreachable!()
            };
            let (got, read) = answer(
                g,
                Need::Summaries,
                b[0],
                b[b.len() - 1],
                grid.clone(),
                &model,
                &none,
            );
            same(
                &got,
                &brute_force(&grid, b[0], b[b.len() - 1], &stored, &none),
            );
            assert!(
                read as i64 <= (days + 2) * 3 / 2,
                "{g:?}: {read} documents for {days} days at 1h"
            );
            // 1 d steps over 400 days: one 30-day document per thirty days.
            let start = BASE + 30 * DAY - (BASE + 30 * DAY).rem_euclid(DAY);
            let grid = window_grid(start, DAY, 360, DAY);
            let Grid::Bounds(b) = &grid else {
                unreachable!()
            };
            let (got, read) = answer(
                g,
                Need::Summaries,
                b[0],
                b[b.len() - 1],
                grid.clone(),
                &model,
                &none,
            );
            same(
                &got,
                &brute_force(&grid, b[0], b[b.len() - 1], &stored, &none),
            );
            assert!(
                read <= 16 * 3 / 2,
                "{g:?}: {read} documents for 360 days at 1d"
            );
        }
    }

    #[test]
    fn starts_are_read_as_long_ranges_and_lists() {
        let ask = |starts: Vec<i64>| Ask {
            level: Level::Buckets,
            starts,
            values: Values::All,
            minutes: false,
        };
        // The edges of a long range and a day of minutes: one range, one list.
        let mut starts = vec![0, 60];
        starts.extend((0..1440).map(|m| 86_400 * 9 + m * 60));
        starts.push(86_400 * 20);
        assert_eq!(
            ask(starts).reads(60),
            vec![
                Starts::Range(86_400 * 9, 86_400 * 10),
                Starts::Only(vec![0, 60, 86_400 * 20]),
            ]
        );
        // Scattered: lists of at most a thousand.
        let scattered: Vec<i64> = (0..2500).map(|k| k * 3600).collect();
        let reads = ask(scattered).reads(60);
        assert_eq!(reads.len(), 3);
        assert!(matches!(&reads[0], Starts::Only(v) if v.len() == 1000));
    }

    #[test]
    fn unstored_readings_push_only_their_bucket_down_to_values() {
        let g = Granularity::Minute;
        let (from, to) = (BASE, BASE + 2 * DAY);
        let plan = Plan::new(g, Need::Aggregates, from, to, Grid::whole(from, to));
        let dirty = BASE + DAY + 600;
        let mut s = plan.start(&[dirty]);
        let mut levels = Vec::new();
        while let Some(ask) = plan.ask(&mut s) {
            levels.push((ask.level, ask.starts.len()));
            if ask.level == Level::Buckets {
                assert_eq!(ask.starts, vec![dirty]);
                assert_eq!(plan.dirty_starts(&s, &ask), vec![dirty]);
            }
            // Every rollup document complete: only the dirty hour goes down.
            if let Level::Rollups(p) = ask.level {
                for &start in &ask.starts {
                    let doc = RollupRead {
                        start,
                        complete: u64::MAX,
                        slots: Vec::new(),
                    };
                    let _ = p;
                    plan.answer_rollup(&mut s, &doc);
                }
            }
            plan.advance(&mut s);
        }
        assert_eq!(
            levels,
            vec![
                (Level::Rollups(Period::Days30), 1),
                (Level::Rollups(Period::Day), 1),
                (Level::Rollups(Period::Hour), 1),
                (Level::Buckets, 1),
            ]
        );
    }
}

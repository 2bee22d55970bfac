//! Plans a range over levels: 30-day, day and hour rollups (the last for
//! minute buckets), buckets, and raw seconds only at the edges, exactly at any
//! boundary.
//!
//! A span can be answered from one document's (or sub-period's) aggregates
//! when it lies inside the range, inside one point of the grid, and holds no
//! bucket with readings not yet stored ("usable"). The planner walks the
//! coarsest level's periods: a usable one is read whole; otherwise its
//! document is read for the sub-periods that are usable, and each sub-period
//! that is not is planned one level down, to a bucket's raw values. So the
//! documents read grow with the number of levels and points, not with the
//! range. [`Plan::fold`] applies the same rule to what was read, so nothing
//! counts twice. Pure: the caller does the reading.

use std::collections::BTreeSet;

use super::Grid;
use crate::domain::{Agg, BucketRead, Granularity, Level, Period, Starts, Values};

/// One level of documents: their length and that of their sub-periods (none
/// for minute buckets, whose values are the next step down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tier {
    level: Level,
    len: i64,
    slot: i64,
}

fn tiers(granularity: Granularity) -> Vec<Tier> {
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

/// What a read is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Coarsest level: documents usable whole (others in the range are skipped).
    Whole,
    /// Documents read for their usable sub-periods (and a bucket's values).
    Partial,
    /// Buckets with unstored readings: read whole, laid under those readings.
    Overlay,
}

/// One read the plan needs, per series.
#[derive(Debug, Clone)]
pub struct PlannedRead {
    pub tier: usize,
    pub role: Role,
    pub level: Level,
    pub starts: Starts,
    pub slots: bool,
    pub values: Values,
}

#[derive(Debug, Clone)]
pub struct Plan {
    tiers: Vec<Tier>,
    /// Stored seconds `s` with `from <= s < to` count.
    from: i64,
    to: i64,
    grid: Grid,
    /// Starts of buckets holding readings not yet stored, sorted.
    dirty: Vec<i64>,
    whole: Option<(i64, i64)>,
    partial: Vec<Vec<i64>>,
    /// Hour buckets: the minutes whose raw values are needed.
    minutes: BTreeSet<u16>,
    overlay: Vec<i64>,
}

impl Plan {
    /// `from < to`, epoch seconds; `dirty`: bucket starts with unstored readings.
    pub fn new(granularity: Granularity, from: i64, to: i64, grid: Grid, dirty: &[i64]) -> Self {
        let tiers = tiers(granularity);
        let mut dirty = dirty.to_vec();
        dirty.sort_unstable();
        dirty.dedup();
        let mut plan = Self {
            partial: vec![Vec::new(); tiers.len()],
            tiers,
            from,
            to,
            grid,
            dirty,
            whole: None,
            minutes: BTreeSet::new(),
            overlay: Vec::new(),
        };
        let top = plan.tiers[0].len;
        let mut p = from - from.rem_euclid(top);
        while p < to {
            if plan.usable(p, p + top) {
                let (a, _) = plan.whole.get_or_insert((p, p + top));
                plan.whole = Some((*a, p + top));
            } else {
                plan.visit(0, p);
            }
            p += top;
        }
        plan
    }

    /// The grid the points follow.
    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    fn bucket_len(&self) -> i64 {
        self.tiers[self.tiers.len() - 1].len
    }

    fn overlaps(&self, start: i64, end: i64) -> bool {
        start < self.to && end > self.from
    }

    fn dirty_inside(&self, start: i64, end: i64) -> bool {
        let first = self
            .dirty
            .partition_point(|&d| d + self.bucket_len() <= start);
        self.dirty.get(first).is_some_and(|&d| d < end)
    }

    /// Whether `[start, end)` can be answered from its aggregates.
    fn usable(&self, start: i64, end: i64) -> bool {
        start >= self.from
            && end <= self.to
            && self.grid.single_point(start, end).is_some()
            && !self.dirty_inside(start, end)
    }

    /// Plans the unusable period `p` of tier `t` that overlaps the range.
    fn visit(&mut self, t: usize, p: i64) {
        let tier = self.tiers[t];
        if tier.level == Level::Buckets {
            if self.dirty_inside(p, p + tier.len) {
                self.overlay.push(p);
                return;
            }
            self.partial[t].push(p);
            if tier.slot > 0 {
                for m in 0..tier.len / tier.slot {
                    let s = p + m * tier.slot;
                    if self.overlaps(s, s + tier.slot) && !self.usable(s, s + tier.slot) {
                        self.minutes.insert(m as u16);
                    }
                }
            }
            return;
        }
        let mut any_usable = false;
        for c in 0..tier.len / tier.slot {
            let s = p + c * tier.slot;
            if !self.overlaps(s, s + tier.slot) {
                continue;
            }
            if self.usable(s, s + tier.slot) {
                any_usable = true;
            } else {
                self.visit(t + 1, s);
            }
        }
        if any_usable {
            self.partial[t].push(p);
        }
    }

    /// The reads, per series: at most one per level and role.
    pub fn reads(&self) -> Vec<PlannedRead> {
        let mut out = Vec::new();
        if let Some((from, to)) = self.whole {
            out.push(PlannedRead {
                tier: 0,
                role: Role::Whole,
                level: self.tiers[0].level,
                starts: Starts::Range(from, to),
                slots: false,
                values: Values::None,
            });
        }
        for (t, starts) in self.partial.iter().enumerate() {
            if starts.is_empty() {
                continue;
            }
            let tier = self.tiers[t];
            let values = match (tier.level, tier.slot) {
                (Level::Buckets, 0) => Values::All,
                (Level::Buckets, _) => Values::Minutes(self.minutes.iter().copied().collect()),
                _ => Values::None,
            };
            let mut starts = starts.clone();
            starts.sort_unstable();
            out.push(PlannedRead {
                tier: t,
                role: Role::Partial,
                level: tier.level,
                starts: Starts::Only(starts),
                slots: tier.slot > 0,
                values,
            });
        }
        if !self.overlay.is_empty() {
            out.push(PlannedRead {
                tier: self.tiers.len() - 1,
                role: Role::Overlay,
                level: Level::Buckets,
                starts: Starts::Only(self.overlay.clone()),
                slots: false,
                values: Values::All,
            });
        }
        out
    }

    /// The buckets to lay unstored readings over.
    pub fn overlay_starts(&self) -> &[i64] {
        &self.overlay
    }

    /// Adds what one read document contributes to `points`.
    pub fn fold(&self, tier: usize, role: Role, b: &BucketRead, points: &mut [Agg]) {
        let t = self.tiers[tier];
        match role {
            Role::Whole => {
                if self.usable(b.start, b.start + t.len) {
                    self.add_agg(b.start, &b.agg, points);
                }
            }
            Role::Partial => {
                let mut from_slot = [false; 60];
                for &(k, ref agg) in &b.slots {
                    let s = b.start + i64::from(k) * t.slot;
                    if self.usable(s, s + t.slot) {
                        self.add_agg(s, agg, points);
                        from_slot[usize::from(k % 60)] = true;
                    }
                }
                if t.level == Level::Buckets {
                    for &(offset, value) in &b.values {
                        let used = t.slot > 0
                            && from_slot[usize::from((i64::from(offset) / t.slot) as u16 % 60)];
                        if !used {
                            self.add_value(b.start + i64::from(offset), value, points);
                        }
                    }
                }
            }
            Role::Overlay => self.fold_values(b.start, &b.values, points),
        }
    }

    /// Adds raw values of the bucket at `start` (an overlaid one).
    pub fn fold_values(&self, start: i64, values: &[(u16, f64)], points: &mut [Agg]) {
        for &(offset, value) in values {
            self.add_value(start + i64::from(offset), value, points);
        }
    }

    fn add_agg(&self, at: i64, agg: &Agg, points: &mut [Agg]) {
        if let Some(p) = self.grid.point(at) {
            points[p].merge(agg);
        }
    }

    fn add_value(&self, ts: i64, value: f64, points: &mut [Agg]) {
        if ts >= self.from
            && ts < self.to
            && let Some(p) = self.grid.point(ts)
        {
            points[p].add(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::grid::Calendar;
    use super::*;
    use jiff::tz::TimeZone;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The documents a store would hold for raw seconds: buckets with their
    /// values and minute aggregates, and every rollup level.
    struct Model {
        docs: BTreeMap<(Level, i64), BucketRead>,
    }

    impl Model {
        fn new(g: Granularity, data: &BTreeMap<i64, f64>) -> Self {
            let mut docs: BTreeMap<(Level, i64), BucketRead> = BTreeMap::new();
            let mut put = |level: Level, len: i64, slot: i64, ts: i64, v: f64, value: bool| {
                let start = ts - ts.rem_euclid(len);
                let d = docs.entry((level, start)).or_insert_with(|| BucketRead {
                    start,
                    ..BucketRead::default()
                });
                d.agg.add(v);
                if slot > 0 {
                    let k = ((ts - start) / slot) as u16;
                    match d.slots.iter_mut().find(|(s, _)| *s == k) {
                        Some((_, a)) => a.add(v),
                        None => {
                            let mut a = Agg::default();
                            a.add(v);
                            d.slots.push((k, a));
                            d.slots.sort_by_key(|&(s, _)| s);
                        }
                    }
                }
                if value {
                    d.values.push(((ts - start) as u16, v));
                }
            };
            for (&ts, &v) in data {
                for &p in Period::levels(g) {
                    put(
                        Level::Rollups(p),
                        p.seconds(),
                        p.slot_seconds(),
                        ts,
                        v,
                        false,
                    );
                }
                let slot = if g == Granularity::Hour { 60 } else { 0 };
                put(Level::Buckets, g.seconds(), slot, ts, v, true);
            }
            Self { docs }
        }

        /// Answers a planned read as the store would: matching starts, only
        /// the parts asked for.
        fn read(&self, r: &PlannedRead) -> Vec<BucketRead> {
            let wanted = |s: i64| match &r.starts {
                Starts::Range(a, b) => s >= *a && s < *b,
                Starts::Only(v) => v.contains(&s),
            };
            self.docs
                .iter()
                .filter(|((l, s), _)| *l == r.level && wanted(*s))
                .map(|(_, d)| BucketRead {
                    start: d.start,
                    agg: d.agg,
                    slots: if r.slots { d.slots.clone() } else { Vec::new() },
                    values: d
                        .values
                        .iter()
                        .copied()
                        .filter(|(o, _)| match &r.values {
                            Values::None => false,
                            Values::All => true,
                            Values::Minutes(ms) => ms.contains(&(o / 60)),
                        })
                        .collect(),
                })
                .collect()
        }
    }

    /// Plans, reads from the model, overlays unstored values, folds.
    fn answer(
        g: Granularity,
        from: i64,
        to: i64,
        grid: Grid,
        stored: &BTreeMap<i64, f64>,
        unstored: &BTreeMap<i64, f64>,
    ) -> (Vec<Agg>, usize) {
        let dirty: Vec<i64> = unstored.keys().map(|&ts| g.bucket_start(ts)).collect();
        let plan = Plan::new(g, from, to, grid, &dirty);
        let model = Model::new(g, stored);
        let mut points = vec![Agg::default(); plan.grid().points()];
        let mut docs = 0;
        for r in plan.reads() {
            for b in model.read(&r) {
                docs += 1;
                if r.role == Role::Overlay {
                    let mut values: BTreeMap<u16, f64> = b.values.iter().copied().collect();
                    for (&ts, &v) in unstored.range(b.start..b.start + g.seconds()) {
                        values.insert((ts - b.start) as u16, v);
                    }
                    let values: Vec<_> = values.into_iter().collect();
                    plan.fold_values(b.start, &values, &mut points);
                } else {
                    plan.fold(r.tier, r.role, &b, &mut points);
                }
            }
        }
        // Overlaid buckets with nothing stored yet.
        for &start in plan.overlay_starts() {
            if !model.docs.contains_key(&(Level::Buckets, start)) {
                let values: Vec<_> = unstored
                    .range(start..start + g.seconds())
                    .map(|(&ts, &v)| ((ts - start) as u16, v))
                    .collect();
                plan.fold_values(start, &values, &mut points);
            }
        }
        (points, docs)
    }

    fn brute_force(
        grid: &Grid,
        from: i64,
        to: i64,
        stored: &BTreeMap<i64, f64>,
        unstored: &BTreeMap<i64, f64>,
    ) -> Vec<Agg> {
        let mut all = stored.clone();
        all.extend(unstored.iter().map(|(&k, &v)| (k, v)));
        let mut points = vec![Agg::default(); grid.points()];
        for (&ts, &v) in all.range(from..to) {
            if let Some(p) = grid.point(ts) {
                points[p].add(v);
            }
        }
        points
    }

    fn granularity() -> impl Strategy<Value = Granularity> {
        prop_oneof![Just(Granularity::Minute), Just(Granularity::Hour)]
    }

    const DAY: i64 = 86_400;
    /// 2026-03-01: the data spans both spring daylight-saving changes.
    const BASE: i64 = 1_772_323_200;

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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn averages_equal_brute_force_at_any_boundary(
            g in granularity(),
            data in prop::collection::btree_map(BASE..BASE + 40 * DAY, -100i32..100, 0..400),
            from in BASE..BASE + 40 * DAY,
            len in prop_oneof![1i64..4 * 3600, 1i64..40 * DAY],
            unstored_every in prop_oneof![Just(0usize), 3usize..40],
        ) {
            let (stored, unstored) = split(data, unstored_every);
            let to = from + len;
            let grid = Grid::whole(from, to);
            let (got, _) = answer(g, from, to, grid.clone(), &stored, &unstored);
            prop_assert_eq!(got, brute_force(&grid, from, to, &stored, &unstored));
        }

        #[test]
        fn fixed_step_series_equal_brute_force(
            g in granularity(),
            data in prop::collection::btree_map(BASE..BASE + 3 * DAY, -100i32..100, 0..300),
            from in BASE..BASE + 3 * DAY,
            len in 1i64..3 * DAY,
            step_minutes in prop_oneof![Just(1i64), Just(5), Just(7), Just(60), Just(90), Just(1440)],
            unstored_every in prop_oneof![Just(0usize), 3usize..40],
        ) {
            let (stored, unstored) = split(data, unstored_every);
            let to = from + len;
            let grid = Grid::aligned(from, to, step_minutes * 60);
            let (got, _) = answer(g, from, to, grid.clone(), &stored, &unstored);
            prop_assert_eq!(got, brute_force(&grid, from, to, &stored, &unstored));
        }

        #[test]
        fn calendar_series_in_time_zones_equal_brute_force(
            g in granularity(),
            data in prop::collection::btree_map(BASE..BASE + 70 * DAY, -100i32..100, 0..400),
            from in BASE..BASE + 70 * DAY,
            len in 1i64..70 * DAY,
            step in prop_oneof![Just(Calendar::Day), Just(Calendar::Week), Just(Calendar::Month)],
            zone in prop_oneof![
                Just("UTC"), Just("Europe/Berlin"), Just("America/New_York"),
                Just("Asia/Kolkata"), Just("Australia/Lord_Howe"), Just("America/St_Johns"),
            ],
            unstored_every in prop_oneof![Just(0usize), 5usize..40],
        ) {
            let (stored, unstored) = split(data, unstored_every);
            let to = from + len;
            let tz = TimeZone::get(zone).expect("bundled");
            let grid = Grid::calendar(from, to, step, &tz, 10_000).expect("grid");
            let (got, _) = answer(g, from, to, grid.clone(), &stored, &unstored);
            prop_assert_eq!(got, brute_force(&grid, from, to, &stored, &unstored));
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
            let data = dense(BASE, 402, every);
            for days in [1, 7, 30, 60, 400] {
                let to = from + days * DAY - 3600 - 120 - 7;
                let grid = Grid::whole(from, to);
                let (got, read) = answer(g, from, to, grid.clone(), &data, &none);
                assert_eq!(got, brute_force(&grid, from, to, &data, &none));
                // The whole thirty-day periods inside, plus at most two
                // documents of each level at the edges.
                let whole = ((to - from) / Period::Days30.seconds()) as usize;
                let edges = 2 * (Period::levels(g).len() + 1);
                assert!(read <= whole + edges, "{g:?} {days} d: {read} documents");
            }
        }
    }

    #[test]
    fn unstored_readings_push_only_their_bucket_down_to_values() {
        let g = Granularity::Minute;
        let from = BASE;
        let to = BASE + 2 * DAY;
        let dirty = [BASE + DAY + 600];
        let plan = Plan::new(g, from, to, Grid::whole(from, to), &dirty);
        let reads = plan.reads();
        let roles: Vec<_> = reads.iter().map(|r| (r.role, r.level)).collect();
        assert_eq!(
            roles,
            vec![
                (Role::Partial, Level::Rollups(Period::Days30)),
                (Role::Partial, Level::Rollups(Period::Day)),
                (Role::Partial, Level::Rollups(Period::Hour)),
                (Role::Overlay, Level::Buckets),
            ]
        );
        assert_eq!(plan.overlay_starts(), &dirty);
    }

    #[test]
    fn a_range_inside_one_minute_reads_one_bucket() {
        let plan = Plan::new(Granularity::Minute, 65, 70, Grid::whole(65, 70), &[]);
        let reads = plan.reads();
        assert_eq!(reads.len(), 1);
        assert!(matches!(&reads[0].starts, Starts::Only(s) if s == &vec![60]));
        assert_eq!(reads[0].values, Values::All);
    }
}

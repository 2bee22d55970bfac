//! Answers range queries from buckets, exactly at any boundary.
//!
//! A [`Plan`] splits a range into the buckets it covers whole (answered from
//! their pre-aggregates, or the per-minute ones of hour buckets when a step
//! boundary falls inside) and the at most two edge buckets it covers in part
//! (read value by value, or minute by minute where a minute is inside).
//! [`Plan::fold`] turns what was read into one [`Agg`] per point. Pure: the
//! caller does the reading.

use crate::domain::{Agg, BucketRead, Granularity, Starts, Values};

/// `[query]`: how much one query may ask for.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    #[serde(with = "humantime_serde")]
    pub max_range: std::time::Duration,
    pub max_points: usize,
}

pub const DEFAULT_MAX_RANGE: std::time::Duration = std::time::Duration::from_secs(400 * 24 * 3600);
pub const DEFAULT_MAX_POINTS: usize = 10_000;

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_range: DEFAULT_MAX_RANGE,
            max_points: DEFAULT_MAX_POINTS,
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), crate::settings::Invalid> {
        crate::settings::at_least_one(&[("query.max_points", self.max_points)])?;
        crate::settings::longer_than_zero(&[("query.max_range", self.max_range)])
    }
}

/// Points of a result: point `i` covers `[origin + i·step, origin + (i+1)·step)`,
/// clipped to the queried range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub origin: i64,
    pub step: i64,
    pub points: usize,
}

impl Grid {
    /// One point for the whole range (an average).
    pub fn whole(from: i64, to: i64) -> Self {
        Self {
            origin: from,
            step: (to - from).max(1),
            points: 1,
        }
    }

    /// Steps aligned to multiples of `step` since the epoch (whole UTC days for
    /// `1d`), so the same step always yields the same point boundaries.
    pub fn aligned(from: i64, to: i64, step: i64) -> Self {
        let step = step.max(1);
        let origin = from.saturating_sub(from.rem_euclid(step));
        // In i128: near the ends of i64, `to - origin + step` would overflow.
        let span = i128::from(to) - i128::from(origin);
        let points = if span > 0 {
            usize::try_from((span + i128::from(step) - 1) / i128::from(step)).unwrap_or(usize::MAX)
        } else {
            0
        };
        Self {
            origin,
            step,
            points,
        }
    }

    fn point(&self, ts: i64) -> usize {
        ((ts - self.origin).div_euclid(self.step)) as usize
    }

    /// The point that `[start, end)` falls in entirely, if it does not straddle one.
    fn single_point(&self, start: i64, end: i64) -> Option<usize> {
        let p = self.point(start);
        (self.point(end - 1) == p).then_some(p)
    }
}

/// A bucket covered in part, and (hour buckets) which of its minutes are too.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Edge {
    start: i64,
    partial_minutes: Vec<u16>,
}

#[derive(Debug, Clone)]
pub struct Plan {
    granularity: Granularity,
    /// Stored seconds `s` with `from <= s < to` count.
    from: i64,
    to: i64,
    grid: Grid,
    /// Bucket starts of the buckets inside the range.
    whole: (i64, i64),
    edges: Vec<Edge>,
}

impl Plan {
    /// `from < to`, epoch seconds; the grid must cover the range.
    pub fn new(granularity: Granularity, from: i64, to: i64, grid: Grid) -> Self {
        let len = granularity.seconds();
        let first = granularity.bucket_start(from);
        let last = granularity.bucket_start(to - 1);
        let whole_from = if first == from { first } else { first + len };
        let whole_to = granularity.bucket_start(to);
        let mut edge_starts = Vec::with_capacity(2);
        if first < from {
            edge_starts.push(first);
        }
        if last + len > to && edge_starts.last() != Some(&last) {
            edge_starts.push(last);
        }
        let mut plan = Self {
            granularity,
            from,
            to,
            grid,
            whole: (whole_from, whole_to.max(whole_from)),
            edges: Vec::new(),
        };
        plan.edges = edge_starts
            .into_iter()
            .map(|start| Edge {
                start,
                partial_minutes: match granularity {
                    Granularity::Minute => Vec::new(),
                    Granularity::Hour => (0..60u16)
                        .filter(|&m| {
                            let s = start + 60 * i64::from(m);
                            plan.overlaps(s, s + 60) && plan.whole_point(s, s + 60).is_none()
                        })
                        .collect(),
                },
            })
            .collect();
        plan
    }

    fn overlaps(&self, start: i64, end: i64) -> bool {
        start < self.to && end > self.from
    }

    /// The point a span can be answered in from its aggregates, if it can.
    fn whole_point(&self, start: i64, end: i64) -> Option<usize> {
        if start >= self.from && end <= self.to {
            self.grid.single_point(start, end)
        } else {
            None
        }
    }

    /// The buckets covered whole: their starts, and whether their per-minute
    /// aggregates are needed because a step boundary falls inside them.
    pub fn whole_buckets(&self) -> Option<(Starts, bool)> {
        let (from, to) = self.whole;
        if from >= to {
            return None;
        }
        let minutes = self.granularity == Granularity::Hour
            && (self.grid.step % 3600 != 0 || self.grid.origin % 3600 != 0)
            && self.grid.points > 1;
        Some((Starts::Range(from, to), minutes))
    }

    /// The buckets covered in part and what to read of them.
    pub fn edge_buckets(&self) -> Option<(Starts, bool, Values)> {
        if self.edges.is_empty() {
            return None;
        }
        let starts = Starts::Only(self.edges.iter().map(|e| e.start).collect());
        Some(match self.granularity {
            Granularity::Minute => (starts, false, Values::All),
            Granularity::Hour => {
                let mut minutes: Vec<u16> = self
                    .edges
                    .iter()
                    .flat_map(|e| e.partial_minutes.iter().copied())
                    .collect();
                minutes.sort_unstable();
                minutes.dedup();
                (starts, true, Values::Minutes(minutes))
            }
        })
    }

    /// Folds what was read (whole and edge buckets, any order) into the points.
    pub fn fold<'a>(&self, buckets: impl IntoIterator<Item = &'a BucketRead>) -> Vec<Agg> {
        let mut points = vec![Agg::default(); self.grid.points];
        for b in buckets {
            self.fold_bucket(b, &mut points);
        }
        points
    }

    fn fold_bucket(&self, b: &BucketRead, points: &mut [Agg]) {
        let len = self.granularity.seconds();
        if let Some(p) = self.whole_point(b.start, b.start + len) {
            points[p].merge(&b.agg);
            return;
        }
        let (from, to, grid) = (self.from, self.to, self.grid);
        let add_value = |points: &mut [Agg], offset: u16, value: f64| {
            let ts = b.start + i64::from(offset);
            if ts >= from && ts < to {
                points[grid.point(ts)].add(value);
            }
        };
        match self.granularity {
            Granularity::Minute => {
                for &(offset, value) in &b.values {
                    add_value(points, offset, value);
                }
            }
            Granularity::Hour => {
                // A minute inside one point comes from `m`, any other from its values.
                let mut from_m = [false; 60];
                for &(minute, ref agg) in &b.minutes {
                    let s = b.start + 60 * i64::from(minute);
                    if let Some(p) = self.whole_point(s, s + 60) {
                        points[p].merge(agg);
                        from_m[usize::from(minute % 60)] = true;
                    }
                }
                for &(offset, value) in &b.values {
                    if !from_m[usize::from(offset / 60 % 60)] {
                        add_value(points, offset, value);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Builds what the store would return for a plan, from raw seconds.
    fn read_like_the_store(
        plan: &Plan,
        g: Granularity,
        data: &BTreeMap<i64, f64>,
    ) -> Vec<BucketRead> {
        let len = g.seconds();
        let mut buckets: BTreeMap<i64, BucketRead> = BTreeMap::new();
        for (&ts, &v) in data {
            let b = buckets
                .entry(g.bucket_start(ts))
                .or_insert_with(|| BucketRead {
                    start: g.bucket_start(ts),
                    ..BucketRead::default()
                });
            b.agg.add(v);
            b.values.push((g.offset(ts), v));
        }
        let project = |b: &BucketRead, minutes: bool, values: &Values| {
            let mut out = BucketRead {
                start: b.start,
                agg: b.agg,
                ..BucketRead::default()
            };
            if minutes {
                let mut m: BTreeMap<u16, Agg> = BTreeMap::new();
                for &(o, v) in &b.values {
                    m.entry(o / 60).or_default().add(v);
                }
                out.minutes = m.into_iter().collect();
            }
            out.values = b
                .values
                .iter()
                .copied()
                .filter(|(o, _)| match values {
                    Values::None => false,
                    Values::All => true,
                    Values::Minutes(ms) => ms.contains(&(o / 60)),
                })
                .collect();
            out
        };
        let mut out = Vec::new();
        if let Some((Starts::Range(from, to), minutes)) = plan.whole_buckets() {
            assert_eq!(from % len, 0);
            out.extend(
                buckets
                    .range(from..to)
                    .map(|(_, b)| project(b, minutes, &Values::None)),
            );
        }
        if let Some((Starts::Only(starts), minutes, values)) = plan.edge_buckets() {
            assert!(starts.len() <= 2, "at most two edge buckets");
            out.extend(
                starts
                    .iter()
                    .filter_map(|s| buckets.get(s))
                    .map(|b| project(b, minutes, &values)),
            );
        }
        out
    }

    fn brute_force(grid: Grid, from: i64, to: i64, data: &BTreeMap<i64, f64>) -> Vec<Agg> {
        let mut points = vec![Agg::default(); grid.points];
        for (&ts, &v) in data.range(from..to) {
            points[grid.point(ts)].add(v);
        }
        points
    }

    fn granularity() -> impl Strategy<Value = Granularity> {
        prop_oneof![Just(Granularity::Minute), Just(Granularity::Hour)]
    }

    proptest! {
        #[test]
        fn averages_equal_brute_force_at_any_boundary(
            g in granularity(),
            data in prop::collection::btree_map(0i64..4 * 3600, -100i32..100, 0..300),
            from in 0i64..4 * 3600,
            len in 1i64..4 * 3600,
        ) {
            let data: BTreeMap<i64, f64> = data.into_iter().map(|(k, v)| (k, f64::from(v))).collect();
            let to = from + len;
            let grid = Grid::whole(from, to);
            let plan = Plan::new(g, from, to, grid);
            let got = plan.fold(&read_like_the_store(&plan, g, &data));
            let want = brute_force(grid, from, to, &data);
            prop_assert_eq!(got, want);
        }

        #[test]
        fn series_equal_brute_force_at_any_boundary(
            g in granularity(),
            data in prop::collection::btree_map(0i64..6 * 3600, -100i32..100, 0..300),
            from in 0i64..6 * 3600,
            len in 1i64..6 * 3600,
            step_minutes in prop_oneof![Just(1i64), Just(5), Just(7), Just(15), Just(60), Just(90), Just(120)],
        ) {
            let data: BTreeMap<i64, f64> = data.into_iter().map(|(k, v)| (k, f64::from(v))).collect();
            let to = from + len;
            let grid = Grid::aligned(from, to, step_minutes * 60);
            let plan = Plan::new(g, from, to, grid);
            let got = plan.fold(&read_like_the_store(&plan, g, &data));
            let want = brute_force(grid, from, to, &data);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_range_inside_one_minute_reads_one_edge_bucket() {
        let plan = Plan::new(Granularity::Minute, 65, 70, Grid::whole(65, 70));
        assert!(plan.whole_buckets().is_none());
        let (starts, _, values) = plan.edge_buckets().expect("edge");
        assert!(matches!(starts, Starts::Only(s) if s == vec![60]));
        assert_eq!(values, Values::All);
    }

    #[test]
    fn aligned_ranges_read_no_values() {
        let plan = Plan::new(
            Granularity::Hour,
            3600,
            7200,
            Grid::aligned(3600, 7200, 300),
        );
        assert!(plan.edge_buckets().is_none());
        let (_, minutes) = plan.whole_buckets().expect("whole");
        assert!(
            minutes,
            "5-minute steps inside an hour bucket need its minutes"
        );
        let plan = Plan::new(Granularity::Hour, 3600, 7200 + 90, Grid::whole(3600, 7290));
        let (_, _, values) = plan.edge_buckets().expect("edge");
        assert_eq!(
            values,
            Values::Minutes(vec![1]),
            "only the partly covered minute"
        );
    }

    #[test]
    fn grids_survive_extreme_steps_and_ranges() {
        let g = Grid::aligned(i64::MAX - 10, i64::MAX, i64::MAX);
        assert_eq!(g.points, 1);
        let g = Grid::aligned(i64::MIN + 1, i64::MAX, 60);
        assert!(g.points > 0);
        assert_eq!(Grid::aligned(100, 50, 60).points, 0);
    }

    #[test]
    fn series_points_align_to_the_epoch() {
        let grid = Grid::aligned(3 * 60 + 10, 11 * 60, 5 * 60);
        assert_eq!(
            grid,
            Grid {
                origin: 0,
                step: 300,
                points: 3
            }
        );
    }
}

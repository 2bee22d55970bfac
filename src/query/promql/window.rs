//! Prometheus' windows `(t − range, t]` at every evaluation time, turned into
//! disjoint cells of whole stored seconds, so the planner answers each cell
//! from the coarsest level and a window is the merge of its cells. Pure.

use crate::domain::{Agg, Summary};

/// Evaluation times `start + k·step`, milliseconds, as Prometheus counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    pub start_ms: i64,
    pub step_ms: i64,
    pub n: usize,
}

impl Steps {
    /// `start..=end` every `step` (an instant query is `n = 1`).
    pub fn new(start_ms: i64, end_ms: i64, step_ms: i64) -> Self {
        let step_ms = step_ms.max(1);
        let n = if end_ms < start_ms {
            0
        } else {
            usize::try_from((i128::from(end_ms) - i128::from(start_ms)) / i128::from(step_ms))
                .map_or(usize::MAX, |k| k.saturating_add(1))
        };
        Self {
            start_ms,
            step_ms,
            n,
        }
    }

    pub fn at(&self, k: usize) -> i64 {
        self.start_ms
            .saturating_add(self.step_ms.saturating_mul(k as i64))
    }
}

/// The cells of a set of windows: `bounds` in epoch seconds (cell `i` holds
/// stored seconds `bounds[i] <= s < bounds[i + 1]`), and per evaluation time
/// the cells `[from, to)` its window covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows {
    pub bounds: Vec<i64>,
    pub spans: Vec<(usize, usize)>,
}

/// A window `(t − range, t]` in milliseconds holds the whole seconds
/// `s` with `s·1000 > t − range` and `s·1000 <= t`.
pub fn seconds_of(t_ms: i64, range_ms: i64) -> (i64, i64) {
    (
        t_ms.saturating_sub(range_ms).div_euclid(1000) + 1,
        t_ms.div_euclid(1000) + 1,
    )
}

impl Windows {
    /// The windows of `range_ms` ending at every step, moved back by `offset_ms`.
    pub fn new(steps: &Steps, range_ms: i64, offset_ms: i64) -> Self {
        let ends: Vec<(i64, i64)> = (0..steps.n)
            .map(|k| seconds_of(steps.at(k).saturating_sub(offset_ms), range_ms))
            .collect();
        let mut bounds: Vec<i64> = ends.iter().flat_map(|&(a, b)| [a, b]).collect();
        bounds.sort_unstable();
        bounds.dedup();
        let index = |x: i64| bounds.partition_point(|&b| b < x);
        let spans = ends
            .iter()
            .map(|&(a, b)| if a < b { (index(a), index(b)) } else { (0, 0) })
            .collect();
        Self { bounds, spans }
    }

    /// Stored seconds the cells cover, `[from, to)`, if any.
    pub fn range(&self) -> Option<(i64, i64)> {
        match (self.bounds.first(), self.bounds.last()) {
            (Some(&a), Some(&b)) if a < b => Some((a, b)),
            _ => None,
        }
    }

    #[cfg(test)]
    pub fn cells(&self) -> usize {
        self.bounds.len().saturating_sub(1)
    }

    /// Each window's summary from its cells' (a segment tree: windows may
    /// span many cells when the range is much longer than the step). Cells
    /// are in time order, and so are the merges.
    pub fn fold(&self, cells: &[Option<Summary>]) -> Vec<Option<Summary>> {
        self.fold_with(cells, None, |a, b| match (a, b) {
            (Some(a), Some(b)) => Some(a.then(b)),
            (a, None) => *a,
            (None, b) => *b,
        })
    }

    /// Each window's aggregates from its cells'.
    pub fn fold_aggs(&self, cells: &[Agg]) -> Vec<Agg> {
        self.fold_with(cells, Agg::default(), |a, b| {
            let mut x = *a;
            x.merge(b);
            x
        })
    }

    /// Each window's `join` of its cells, left to right.
    fn fold_with<T: Copy>(&self, cells: &[T], empty: T, join: impl Fn(&T, &T) -> T) -> Vec<T> {
        let size = cells.len().next_power_of_two().max(1);
        let mut tree: Vec<T> = vec![empty; 2 * size];
        tree[size..size + cells.len()].copy_from_slice(cells);
        for i in (1..size).rev() {
            tree[i] = join(&tree[2 * i], &tree[2 * i + 1]);
        }
        self.spans
            .iter()
            .map(|&(from, to)| {
                let (mut left, mut right) = (empty, empty);
                let (mut l, mut r) = (from + size, to + size);
                while l < r {
                    if l & 1 == 1 {
                        left = join(&left, &tree[l]);
                        l += 1;
                    }
                    if r & 1 == 1 {
                        r -= 1;
                        right = join(&tree[r], &right);
                    }
                    l /= 2;
                    r /= 2;
                }
                join(&left, &right)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Sample;
    use proptest::prelude::*;

    #[test]
    fn windows_are_left_open_and_right_closed() {
        // t = 120 s, range 60 s: seconds 61..=120.
        assert_eq!(seconds_of(120_000, 60_000), (61, 121));
        // Milliseconds: (59.5, 120.5] holds 60..=120.
        assert_eq!(seconds_of(120_500, 61_000), (60, 121));
        assert_eq!(seconds_of(-1_500, 1_000), (-2, -1));
    }

    #[test]
    fn steps_count_both_ends() {
        assert_eq!(Steps::new(0, 60_000, 15_000).n, 5);
        assert_eq!(Steps::new(0, 0, 15_000).n, 1);
        assert_eq!(Steps::new(10, 0, 15_000).n, 0);
    }

    fn summary_of(values: &[(i64, f64)], from: i64, to: i64) -> Option<Summary> {
        let inside: Vec<Sample> = values
            .iter()
            .filter(|&&(s, _)| s >= from && s < to)
            .map(|&(t, v)| Sample { t, v })
            .collect();
        Summary::of(&inside)
    }

    proptest! {
        /// Folding cells gives every window exactly what summarizing its
        /// seconds gives, however windows overlap or leave gaps.
        #[test]
        fn windows_fold_like_brute_force(
            start in 0i64..100_000,
            step in 1i64..200_000,
            n in 1usize..40,
            range in 1i64..600_000,
            offset in 0i64..100_000,
            secs in proptest::collection::btree_map(0i64..1_000, -64i32..64, 0..200),
        ) {
            let steps = Steps { start_ms: start, step_ms: step, n };
            let w = Windows::new(&steps, range, offset);
            let values: Vec<(i64, f64)> = secs.iter().map(|(&s, &v)| (s, f64::from(v) / 8.0)).collect();
            let cells: Vec<Option<Summary>> = (0..w.cells())
                .map(|i| summary_of(&values, w.bounds[i], w.bounds[i + 1]))
                .collect();
            let folded = w.fold(&cells);
            prop_assert_eq!(folded.len(), n);
            for (k, got) in folded.iter().enumerate() {
                let t = steps.at(k) - offset;
                let (a, b) = seconds_of(t, range);
                let want = summary_of(&values, a, b);
                let key = |s: &Option<Summary>| {
                    s.map(|s| (s.count, s.sum, s.min, s.max, s.first, s.last, s.penult, s.inc, s.resets))
                };
                prop_assert_eq!(key(got), key(&want));
            }
        }
    }
}

//! Uptime (pure): the share of a range in which a series had a reading
//! within its expected interval, and the gaps where it had none.
//!
//! An instant `t` is covered when some reading `r` has `r <= t < r +
//! interval`. Readings arrive folded per window of a grid whose step is at
//! most the interval, as each window's first and last reading: two
//! neighbours inside one window are less than a step apart, so a window
//! covers `[first, last + interval)` without a hole, and the answer from
//! rollup slots is the answer from every reading. The fold needs the
//! windows in time order, starting an interval before the range (a reading
//! just before it covers its start).

/// A stretch without coverage, `[from, to)` in epoch seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    pub from: i64,
    pub to: i64,
}

/// The fold of a range's coverage.
#[derive(Debug, Clone)]
pub struct Coverage {
    from: i64,
    to: i64,
    interval: i64,
    /// Everything before this is decided: covered, or in a gap kept.
    end: i64,
    covered: i64,
    gaps: Vec<Gap>,
    /// Gaps found, kept or not.
    gap_count: u64,
    max_gaps: usize,
}

impl Coverage {
    /// Coverage of `[from, to)` with readings expected every `interval`
    /// seconds (at least 1), keeping the first `max_gaps` gaps.
    pub fn new(from: i64, to: i64, interval: i64, max_gaps: usize) -> Self {
        Self {
            from,
            to: to.max(from),
            interval: interval.max(1),
            end: from,
            covered: 0,
            gaps: Vec::new(),
            gap_count: 0,
            max_gaps,
        }
    }

    /// A window's first and last reading (epoch seconds), windows in time
    /// order.
    pub fn add(&mut self, first: i64, last: i64) {
        let reach = last.saturating_add(self.interval);
        if first > self.end {
            self.gap(self.end, first);
            self.end = first.max(self.from);
        }
        if reach > self.end {
            self.covered += overlap(self.end, reach, self.from, self.to);
            self.end = reach;
        }
    }

    fn gap(&mut self, from: i64, to: i64) {
        let (from, to) = (from.max(self.from), to.min(self.to));
        if from >= to {
            return;
        }
        self.gap_count += 1;
        if self.gaps.len() < self.max_gaps {
            self.gaps.push(Gap { from, to });
        }
    }

    /// The covered share of the range (0 to 1; 0 for an empty range), the
    /// gaps kept, and how many there were in all.
    pub fn finish(mut self) -> (f64, Vec<Gap>, u64) {
        if self.end < self.to {
            self.gap(self.end, self.to);
        }
        let span = self.to - self.from;
        let share = if span > 0 {
            self.covered as f64 / span as f64
        } else {
            0.0
        };
        (share, self.gaps, self.gap_count)
    }
}

/// The length of `[a, b)` inside `[from, to)`.
fn overlap(a: i64, b: i64, from: i64, to: i64) -> i64 {
    (b.min(to) - a.max(from)).max(0)
}

/// The step of the windows an uptime is folded from: the longest level's
/// slot (a day, an hour, a minute) that fits in the interval, so the reads
/// take the coarsest documents that answer exactly; below a minute, the
/// interval itself (read from the buckets' readings).
pub fn step_for(interval: i64) -> i64 {
    [86_400, 3_600, 60]
        .into_iter()
        .find(|&s| s <= interval)
        .unwrap_or(interval.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every second of the range, one by one.
    fn brute(readings: &[i64], from: i64, to: i64, interval: i64) -> (i64, Vec<Gap>) {
        let covered = |t: i64| readings.iter().any(|&r| r <= t && t < r + interval);
        let mut n = 0;
        let mut gaps: Vec<Gap> = Vec::new();
        for t in from..to {
            if covered(t) {
                n += 1;
            } else if let Some(g) = gaps.last_mut().filter(|g| g.to == t) {
                g.to = t + 1;
            } else {
                gaps.push(Gap { from: t, to: t + 1 });
            }
        }
        (n, gaps)
    }

    /// The fold over windows of `step`: each window's first and last.
    fn folded(readings: &[i64], from: i64, to: i64, interval: i64, step: i64) -> Coverage {
        let mut sorted = readings.to_vec();
        sorted.sort_unstable();
        let mut c = Coverage::new(from, to, interval, usize::MAX);
        let mut window: Option<(i64, i64, i64)> = None;
        for r in sorted {
            let w = r.div_euclid(step);
            window = match window {
                Some((k, first, _)) if k == w => Some((k, first, r)),
                Some((_, first, last)) => {
                    c.add(first, last);
                    Some((w, r, r))
                }
                None => Some((w, r, r)),
            };
        }
        if let Some((_, first, last)) = window {
            c.add(first, last);
        }
        c
    }

    proptest! {
        /// Any readings, any window step up to the interval: the share and
        /// the gaps are the brute-force model's, second by second.
        #[test]
        fn the_fold_over_windows_equals_every_second_checked(
            readings in prop::collection::vec(-200i64..1200, 0..40),
            from in 0i64..400,
            len in 0i64..600,
            interval in 1i64..300,
            step_div in 1i64..6,
        ) {
            let to = from + len;
            let step = (interval / step_div).max(1);
            let (share, gaps, count) = folded(&readings, from, to, interval, step).finish();
            let (n, want) = brute(&readings, from, to, interval);
            let want_share = if len > 0 { n as f64 / len as f64 } else { 0.0 };
            prop_assert_eq!(share, want_share);
            prop_assert_eq!(&gaps, &want);
            prop_assert_eq!(count, want.len() as u64);
        }
    }

    #[test]
    fn a_reading_just_before_the_range_covers_its_start() {
        let mut c = Coverage::new(100, 200, 30, 10);
        c.add(80, 80);
        c.add(150, 160);
        let (share, gaps, _) = c.finish();
        assert_eq!(
            gaps,
            vec![Gap { from: 110, to: 150 }, Gap { from: 190, to: 200 }]
        );
        assert_eq!(share, 0.5);
    }

    #[test]
    fn gaps_past_the_limit_are_counted_not_kept() {
        let mut c = Coverage::new(0, 100, 1, 2);
        for t in (0..100).step_by(10) {
            c.add(t, t);
        }
        let (_, gaps, count) = c.finish();
        assert_eq!((gaps.len(), count), (2, 10));
    }

    #[test]
    fn the_step_is_the_coarsest_slot_within_the_interval() {
        assert_eq!(step_for(30), 30);
        assert_eq!(step_for(300), 60);
        assert_eq!(step_for(7_200), 3_600);
        assert_eq!(step_for(3 * 86_400), 86_400);
    }
}

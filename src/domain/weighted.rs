//! Time-weighted averages: each value weighted by the time it held.
//!
//! A reading at `t` holds from `t` until the next reading, or for at most
//! the staleness limit `S` after it, whichever comes first; time that no
//! reading holds is no data. Step weighting (last value carried forward)
//! gives the held time the reading's value; linear weighting joins a reading
//! to the next by a straight line where the next comes within `S`, and holds
//! the value where it does not. A window `[from, to)` averages the integral
//! over its held time by that time, the value carried in from before it
//! included, as historians do (PI's time-weighted summaries, OPC UA's
//! TimeAverage) and TimescaleDB's `time_weight()`.
//!
//! Pieces of a window arrive as [`Summary`]s in time order, whatever level
//! each came from: a summary keeps its run's integrals with every gap
//! counted, so it is usable as it is when its longest gap is within `S`,
//! and the gaps between pieces are weighted here from their edge readings.

use super::{Sample, Summary};

/// How an average weights readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weighting {
    /// Each reading counts once (the mean of readings).
    #[default]
    Readings,
    /// By the time each value held (last value carried forward).
    Time,
    /// By time, with values joined by straight lines.
    Linear,
}

/// A window's time integral over the time readings held in it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Weighted {
    pub integral: f64,
    /// Seconds.
    pub held: i64,
}

impl Weighted {
    /// The time-weighted average, if any time was held.
    pub fn average(&self) -> Option<f64> {
        (self.held > 0).then(|| self.integral / self.held as f64)
    }
}

/// A piece that cannot be weighted as a whole: its longest gap passes the
/// staleness limit, or it was stored without integrals. Its readings (or
/// finer pieces) are to be pushed instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finer;

/// Folds one series' pieces of a window `[from, to)` in time order.
#[derive(Debug, Clone)]
pub struct TimeFold {
    linear: bool,
    staleness: i64,
    from: i64,
    to: i64,
    /// The latest reading so far, before the window or in it.
    last: Option<Sample>,
    acc: Weighted,
}

impl TimeFold {
    /// `carried` is the series' last reading before `from`, if any (one more
    /// than `S` before it holds nothing in the window, so any is fine).
    /// `Weighting::Readings` folds as `Time` does.
    pub fn new(
        weighting: Weighting,
        staleness: i64,
        from: i64,
        to: i64,
        carried: Option<Sample>,
    ) -> Self {
        Self {
            linear: weighting == Weighting::Linear,
            staleness: staleness.max(1),
            from,
            to,
            last: carried.filter(|c| c.t < from),
            acc: Weighted::default(),
        }
    }

    /// Whether `piece` can be pushed whole.
    pub fn takes(&self, piece: &Summary) -> bool {
        piece.integrals.is_some_and(|i| i.gap <= self.staleness)
    }

    /// Adds a piece whose readings all lie in the window, after every
    /// reading pushed so far.
    pub fn push(&mut self, piece: &Summary) -> Result<(), Finer> {
        let Some(i) = piece.integrals.filter(|i| i.gap <= self.staleness) else {
            return Err(Finer);
        };
        self.join(piece.first);
        self.acc.integral += if self.linear { i.linear } else { i.step };
        self.acc.held += piece.last.t - piece.first.t;
        self.last = Some(piece.last);
        Ok(())
    }

    /// Adds one reading in the window, after every reading pushed so far.
    pub fn push_sample(&mut self, x: Sample) {
        self.join(x);
        self.last = Some(x);
    }

    /// The window's figures: what the last reading holds up to the end.
    /// `next` is the series' first reading at or after the window's end, if
    /// any: a line runs to it (one more than `S` after the last reading is
    /// not joined, so any is fine).
    pub fn finish(mut self, next: Option<Sample>) -> Weighted {
        match next.filter(|n| n.t >= self.to) {
            Some(n) => self.join(n),
            None => {
                if let Some(p) = self.last {
                    self.hold(p, p.t + self.staleness);
                }
            }
        }
        self.acc
    }

    /// Weighs the time from the latest reading to `next`.
    fn join(&mut self, next: Sample) {
        let Some(p) = self.last else { return };
        if next.t - p.t > self.staleness {
            self.hold(p, p.t + self.staleness);
            return;
        }
        let (a, b) = (p.t.max(self.from), next.t.min(self.to));
        if a >= b {
            return;
        }
        let value = |x: i64| {
            if self.linear {
                p.v + (next.v - p.v) * (x - p.t) as f64 / (next.t - p.t) as f64
            } else {
                p.v
            }
        };
        self.acc.integral += (value(a) + value(b)) / 2.0 * (b - a) as f64;
        self.acc.held += b - a;
    }

    /// `p`'s value held from it to `until`, within the window.
    fn hold(&mut self, p: Sample, until: i64) {
        let (a, b) = (p.t.max(self.from), until.min(self.to));
        if a < b {
            self.acc.integral += p.v * (b - a) as f64;
            self.acc.held += b - a;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Second by second: the held value of each second of the window.
    pub(crate) fn brute(
        xs: &[Sample],
        linear: bool,
        staleness: i64,
        from: i64,
        to: i64,
    ) -> Weighted {
        let mut w = Weighted::default();
        for x in from..to {
            let Some(k) = xs.iter().rposition(|s| s.t <= x) else {
                continue;
            };
            let p = xs[k];
            if x - p.t >= staleness {
                continue;
            }
            let value = match xs.get(k + 1) {
                Some(n) if linear && n.t - p.t <= staleness => {
                    let at = |y: i64| p.v + (n.v - p.v) * (y - p.t) as f64 / (n.t - p.t) as f64;
                    (at(x) + at(x + 1)) / 2.0
                }
                _ => p.v,
            };
            w.integral += value;
            w.held += 1;
        }
        w
    }

    pub(crate) fn samples() -> impl Strategy<Value = Vec<Sample>> {
        prop::collection::btree_map(0i64..2000, -100i32..100, 0..60).prop_map(|m| {
            m.into_iter()
                .map(|(t, v)| Sample {
                    t,
                    v: f64::from(v) / 4.0,
                })
                .collect()
        })
    }

    pub(crate) fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    proptest! {
        /// Readings cut into runs anywhere, each run pushed whole where the
        /// fold takes it and reading by reading where not, weigh as the
        /// second-by-second model does, for both weightings.
        #[test]
        fn pieces_weigh_as_every_second_does(
            xs in samples(),
            from in 0i64..1500,
            len in 1i64..1500,
            staleness in prop_oneof![1i64..30, 30i64..400, Just(100_000)],
            cuts in prop::collection::vec(1usize..8, 1..20),
            linear in any::<bool>(),
        ) {
            let to = from + len;
            let carried = xs.iter().rev().find(|x| x.t < from).copied();
            let inside: Vec<Sample> = xs.iter().copied().filter(|x| x.t >= from && x.t < to).collect();
            let weighting = if linear { Weighting::Linear } else { Weighting::Time };
            let mut fold = TimeFold::new(weighting, staleness, from, to, carried);
            let mut rest = &inside[..];
            let mut k = 0;
            while !rest.is_empty() {
                let n = cuts[k % cuts.len()].min(rest.len());
                k += 1;
                let (run, after) = rest.split_at(n);
                rest = after;
                let piece = Summary::of(run).expect("a run");
                if fold.takes(&piece) {
                    fold.push(&piece).expect("taken");
                } else {
                    prop_assert_eq!(fold.push(&piece), Err(Finer));
                    run.iter().for_each(|&x| fold.push_sample(x));
                }
            }
            let after = xs.iter().find(|x| x.t >= to).copied();
            let got = fold.finish(after);
            let want = brute(&xs, linear, staleness, from, to);
            prop_assert_eq!(got.held, want.held);
            prop_assert!(close(got.integral, want.integral), "{} against {}", got.integral, want.integral);
        }
    }

    /// The valve: 0 for 23 hours, then 500 readings around 80 in
    /// its busiest hour. Its readings average near 80, its day near 3.3.
    #[test]
    fn a_value_reported_by_exception_weighs_by_the_time_it_held() {
        let day = 86_400;
        let mut xs = vec![Sample { t: 0, v: 0.0 }];
        for k in 0..500 {
            xs.push(Sample {
                t: 23 * 3600 + k * 7,
                v: 80.0 + f64::from(k as i32 % 3 - 1),
            });
        }
        let s = Summary::of(&xs).expect("readings");
        assert!(s.avg() > 79.0);
        let mut fold = TimeFold::new(Weighting::Time, day, 0, day, None);
        fold.push(&s).expect("within a day's staleness");
        let w = fold.finish(None);
        assert_eq!(w.held, day);
        let avg = w.average().expect("held");
        assert!((3.2..3.4).contains(&avg), "{avg}");
        // With a 1 h staleness limit the valve's 23 quiet hours are mostly
        // no data: only its first hour and the busy one count.
        let mut fold = TimeFold::new(Weighting::Time, 3600, 0, day, None);
        assert_eq!(fold.push(&s), Err(Finer));
        xs.iter().for_each(|&x| fold.push_sample(x));
        let w = fold.finish(None);
        // Its first hour, the busy hour's readings and the rest of the day.
        assert_eq!(w.held, 3600 + 499 * 7 + (day - (23 * 3600 + 499 * 7)));
        assert!((39.0..41.0).contains(&w.average().expect("held")));
    }

    #[test]
    fn the_value_carried_in_counts_and_a_stale_one_does_not() {
        let before = Sample { t: 90, v: 10.0 };
        let inside = Sample { t: 150, v: 20.0 };
        let fold = |staleness, linear| {
            let w = if linear {
                Weighting::Linear
            } else {
                Weighting::Time
            };
            let mut f = TimeFold::new(w, staleness, 100, 200, Some(before));
            f.push_sample(inside);
            f.finish(None)
        };
        // 10 over [100, 150), 20 over [150, 200).
        assert_eq!(
            fold(1000, false),
            Weighted {
                integral: 1500.0,
                held: 100
            }
        );
        // The line from (90, 10) to (150, 20) over [100, 150): 10.0 + 1/6·(10..60).
        let w = fold(1000, true);
        assert!(close(
            w.integral,
            (10.0 + 10.0 / 6.0 + 20.0) / 2.0 * 50.0 + 1000.0
        ));
        // 5 s of staleness: the carried reading went stale before the window.
        assert_eq!(
            fold(5, false),
            Weighted {
                integral: 100.0,
                held: 5
            }
        );
    }
}

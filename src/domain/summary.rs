//! What a span of readings keeps so that every question asked of it can be
//! answered without its values: the rollup slot format, pure.
//!
//! A [`Summary`] of readings in time order merges with the summary of the
//! readings after them, so a window is the merge of its pieces, whichever
//! level each piece came from. It keeps:
//! - count, sum, min and max (averages, `*_over_time`);
//! - the first, second-to-last and last readings (`last_over_time`, `irate`,
//!   extrapolation of `rate`, `increase` and `delta`);
//! - the increase with counter resets corrected, and the resets and changes
//!   (`increase`, `rate`, `resets`, `changes`), as Prometheus counts them;
//! - the sums a least-squares fit needs (`deriv`) and the sum of squares
//!   (`stddev_over_time`), relative to the first reading's time;
//! - the time integrals from the first reading to the last, step and linear,
//!   and the longest gap between readings (time-weighted averages,
//!   [`super::weighted`]).
//!
//! A stored [`Slot`] adds what a left-open window `(t − d, t]` needs: when
//! the slot's first second holds a reading, the slot without it ("the rest",
//! [`Part::Rest`]) and that reading alone ([`Part::First`]) are summaries too,
//! so a window aligned to slots is answered from slots alone.

use super::{Agg, Sketch};

/// A reading: epoch seconds and value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub t: i64,
    pub v: f64,
}

/// Sums relative to the first reading's time `t0`: Σ(t − t0), Σ(t − t0)²,
/// Σ(t − t0)·v and Σv².
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Moments {
    pub st: f64,
    pub stt: f64,
    pub stv: f64,
    pub svv: f64,
}

impl Moments {
    fn of(s: Sample, t0: i64) -> Self {
        let dt = (s.t - t0) as f64;
        Self {
            st: dt,
            stt: dt * dt,
            stv: dt * s.v,
            svv: s.v * s.v,
        }
    }

    /// The same sums for readings whose times move `by` seconds later
    /// relative to the origin (`count` readings, values summing to `sum`).
    fn shifted(self, by: f64, count: f64, sum: f64) -> Self {
        Self {
            st: self.st + count * by,
            stt: self.stt + 2.0 * by * self.st + count * by * by,
            stv: self.stv + by * sum,
            svv: self.svv,
        }
    }

    fn plus(self, o: Self) -> Self {
        Self {
            st: self.st + o.st,
            stt: self.stt + o.stt,
            stv: self.stv + o.stv,
            svv: self.svv + o.svv,
        }
    }
}

/// Time integrals of a run from its first reading to its last, every gap
/// counted: a window's staleness limit is applied where the run is merged
/// ([`super::weighted`]), so a run whose longest gap passes it is answered
/// from finer pieces.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Integrals {
    /// Σ vᵢ·(tᵢ₊₁ − tᵢ): each value held until the next reading.
    pub step: f64,
    /// Σ (vᵢ + vᵢ₊₁)/2·(tᵢ₊₁ − tᵢ): values joined by straight lines.
    pub linear: f64,
    /// The longest tᵢ₊₁ − tᵢ, in seconds (0 for one reading).
    pub gap: i64,
}

impl Integrals {
    /// The integrals of the segment from `a` to the next reading `b`.
    pub fn segment(a: Sample, b: Sample) -> Self {
        let dt = (b.t - a.t) as f64;
        Self {
            step: a.v * dt,
            linear: (a.v + b.v) / 2.0 * dt,
            gap: b.t - a.t,
        }
    }

    /// This run's integrals followed by `later`'s.
    pub fn plus(self, later: Self) -> Self {
        Self {
            step: self.step + later.step,
            linear: self.linear + later.linear,
            gap: self.gap.max(later.gap),
        }
    }
}

/// The increase from `a` to `b` with Prometheus' counter reset rule: a
/// value below the one before it starts the counter again from zero.
pub fn counter_step(a: f64, b: f64) -> f64 {
    if b < a { b } else { b - a }
}

/// A non-empty run of readings in time order, summarized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    pub first: Sample,
    /// The reading before the last (none for a single reading).
    pub penult: Option<Sample>,
    pub last: Sample,
    /// Σ of [`counter_step`] between neighbours.
    pub inc: f64,
    /// Neighbours where the value went down.
    pub resets: u32,
    /// Neighbours whose values differ.
    pub changes: u32,
    pub moments: Moments,
    /// None for a slot stored before they were kept: such a slot is
    /// answered one level down where they are needed.
    pub integrals: Option<Integrals>,
}

impl Summary {
    pub fn one(s: Sample) -> Self {
        Self {
            count: 1,
            sum: s.v,
            min: s.v,
            max: s.v,
            first: s,
            penult: None,
            last: s,
            inc: 0.0,
            resets: 0,
            changes: 0,
            moments: Moments::of(s, s.t),
            integrals: Some(Integrals::default()),
        }
    }

    /// The summary of readings sorted by time (one per second), if any.
    pub fn of(samples: &[Sample]) -> Option<Self> {
        let (&head, rest) = samples.split_first()?;
        let mut s = Self::one(head);
        for &x in rest {
            s.push(x);
        }
        Some(s)
    }

    /// Appends a reading later than every reading so far.
    pub fn push(&mut self, x: Sample) {
        debug_assert!(x.t > self.last.t, "readings in time order");
        let before = self.last;
        self.count += 1;
        self.sum += x.v;
        self.min = self.min.min(x.v);
        self.max = self.max.max(x.v);
        self.inc += counter_step(before.v, x.v);
        self.resets += u32::from(x.v < before.v);
        self.changes += u32::from(x.v != before.v);
        self.moments = self.moments.plus(Moments::of(x, self.first.t));
        self.integrals = self
            .integrals
            .map(|i| i.plus(Integrals::segment(before, x)));
        self.penult = Some(before);
        self.last = x;
    }

    /// This run followed by `later`, whose readings all come after it.
    pub fn then(&self, later: &Summary) -> Summary {
        debug_assert!(later.first.t > self.last.t, "disjoint and in order");
        let by = (later.first.t - self.first.t) as f64;
        Summary {
            count: self.count + later.count,
            sum: self.sum + later.sum,
            min: self.min.min(later.min),
            max: self.max.max(later.max),
            first: self.first,
            penult: later.penult.or(Some(self.last)),
            last: later.last,
            inc: self.inc + later.inc + counter_step(self.last.v, later.first.v),
            resets: self.resets + later.resets + u32::from(later.first.v < self.last.v),
            changes: self.changes + later.changes + u32::from(later.first.v != self.last.v),
            moments: self
                .moments
                .plus(later.moments.shifted(by, later.count as f64, later.sum)),
            integrals: match (self.integrals, later.integrals) {
                (Some(a), Some(b)) => {
                    Some(a.plus(Integrals::segment(self.last, later.first)).plus(b))
                }
                _ => None,
            },
        }
    }

    /// Two runs of disjoint time spans, in whichever order they are.
    pub fn merge(&self, other: &Summary) -> Summary {
        if self.last.t < other.first.t {
            self.then(other)
        } else {
            other.then(self)
        }
    }

    /// Count, sum, min and max.
    pub fn agg(&self) -> Agg {
        Agg {
            count: self.count,
            sum: self.sum,
            min: self.min,
            max: self.max,
        }
    }

    pub fn avg(&self) -> f64 {
        self.sum / self.count as f64
    }
}

/// Merges `piece` into what a cell holds so far.
pub fn fold(into: &mut Option<Summary>, piece: &Summary) {
    *into = Some(match into {
        Some(s) => s.merge(piece),
        None => *piece,
    });
}

/// Which part of a slot a piece of a window covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// All of it.
    Whole,
    /// All but its first second.
    Rest,
    /// Its first second only.
    First,
}

impl Part {
    /// The part of the slot `[start, end)` that `[from, to)` covers, if it is
    /// one of the three (else the piece is answered one level down).
    pub fn of(start: i64, end: i64, from: i64, to: i64) -> Option<Part> {
        let (from, to) = (from.max(start), to.min(end));
        if from >= to {
            return None;
        }
        match (from == start, to == end) {
            (true, true) => Some(Part::Whole),
            (false, true) if from == start + 1 => Some(Part::Rest),
            (true, false) if to == start + 1 => Some(Part::First),
            _ => None,
        }
    }
}

/// The rest of a slot whose first second holds a reading: what cannot be
/// derived from the whole and that reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rest {
    /// The first reading after the first second.
    pub second: Sample,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    /// The rest's longest gap (none where the slot keeps no integrals).
    pub gap: Option<i64>,
}

/// The most readings a slot keeps to be stored as them: a reading takes a
/// byte or more, a summary about 200.
pub const KEPT_READINGS: usize = 256;

/// A stored sub-period: its summary (none if it holds no reading), the write
/// count of the sources it was computed from, its rest and its readings'
/// percentile sketch.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub start: i64,
    pub summary: Option<Summary>,
    /// Writes of the source documents this was computed from: a figure from
    /// fewer writes never replaces one from more (see `store::rollup`).
    pub n: u64,
    /// Present when the first second holds a reading and another follows.
    pub rest: Option<Rest>,
    /// The readings' sketch, where known: a slot with readings has none
    /// when it was computed without one (stored before sketches were kept,
    /// or at another accuracy), and then answers no percentile.
    pub sketch: Option<Sketch>,
    /// The readings themselves, where the roll-up that computed the slot
    /// kept them (see [`Slot::keeping`]): a slot of few readings is stored
    /// as them, everything else following from them (`store::rollup::codec`).
    /// Empty otherwise.
    pub readings: Vec<Sample>,
}

impl Slot {
    /// The slot starting at `start` without readings.
    pub fn empty(start: i64) -> Self {
        Self::of(start, &[], 0)
    }

    /// The slot starting at `start` of readings sorted by time (all inside it).
    pub fn of(start: i64, samples: &[Sample], n: u64) -> Self {
        let Some((&head, tail)) = samples.split_first() else {
            return Self {
                start,
                summary: None,
                n,
                rest: None,
                sketch: None,
                readings: Vec::new(),
            };
        };
        // One pass for the summary and the rest's sum, min and max: the
        // roll-up of every late hour runs this over each of its readings.
        // The sum starts at -0.0, as `Iterator::sum` does.
        let mut summary = Summary::one(head);
        let (mut sum, mut min, mut max) = (-0.0, f64::INFINITY, f64::NEG_INFINITY);
        let mut gap = 0;
        for (i, &x) in tail.iter().enumerate() {
            summary.push(x);
            sum += x.v;
            min = f64::min(min, x.v);
            max = f64::max(max, x.v);
            if i > 0 {
                gap = gap.max(x.t - tail[i - 1].t);
            }
        }
        let rest = (head.t == start && !tail.is_empty()).then(|| Rest {
            second: tail[0],
            sum,
            min,
            max,
            gap: Some(gap),
        });
        Self {
            start,
            summary: Some(summary),
            n,
            rest,
            sketch: None,
            readings: Vec::new(),
        }
    }

    /// The slot keeping its readings (`samples`, the readings [`Slot::of`]
    /// was given), so that it may be stored as them; not past
    /// [`KEPT_READINGS`], where its summary is always the shorter.
    pub fn keeping(mut self, samples: &[Sample]) -> Self {
        if samples.len() <= KEPT_READINGS {
            self.readings = samples.to_vec();
        }
        self
    }

    /// The slot with its readings' sketch at `accuracy` (`samples` are the
    /// readings [`Slot::of`] was given).
    pub fn sketched(mut self, accuracy: f64, samples: &[Sample]) -> Self {
        if samples.is_empty() {
            return self;
        }
        self.sketch = Sketch::new(accuracy).ok().map(|mut sk| {
            for x in samples {
                sk.add(x.v);
            }
            sk
        });
        self
    }

    /// The slot made of consecutive sub-slots (each starting where the one
    /// before ends, the first at `start`): how a level is computed from the
    /// one below.
    /// Its sketch merges theirs, if every one with readings has one of
    /// the same accuracy.
    pub fn of_slots(start: i64, parts: &[Slot]) -> Self {
        let mut summary: Option<Summary> = None;
        let mut rest: Option<Summary> = None;
        let mut n = 0;
        let mut sketch: Option<Option<Sketch>> = None;
        for p in parts {
            n += p.n;
            let Some(s) = &p.summary else { continue };
            sketch = match (sketch, &p.sketch) {
                (None, Some(k)) => Some(Some(k.clone())),
                (Some(Some(mut all)), Some(k)) => Some(all.merge(k).ok().map(|()| all)),
                (_, None) | (Some(None), _) => Some(None),
            };
            if summary.is_none() && p.start == start && s.first.t == start {
                // The first sub-slot holds the slot's first second: its rest
                // starts the slot's rest.
                if let Some(r) = p.part(Part::Rest) {
                    rest = Some(r);
                }
            } else {
                fold(&mut rest, s);
            }
            fold(&mut summary, s);
        }
        let rest = match (&summary, rest) {
            (Some(s), Some(r)) if s.first.t == start => Some(Rest {
                second: r.first,
                sum: r.sum,
                min: r.min,
                max: r.max,
                gap: r.integrals.map(|i| i.gap),
            }),
            _ => None,
        };
        Self {
            start,
            summary,
            n,
            rest,
            sketch: sketch.flatten(),
            readings: Vec::new(),
        }
    }

    /// The sketch of one part of the slot (none if it holds no reading, or
    /// the slot keeps no sketch).
    pub fn sketch_part(&self, part: Part) -> Option<Sketch> {
        let s = self.summary?;
        let k = self.sketch.as_ref()?;
        let at_start = s.first.t == self.start;
        match part {
            Part::Whole => Some(k.clone()),
            Part::Rest if !at_start => Some(k.clone()),
            Part::Rest => (s.count > 1).then(|| {
                let mut rest = k.clone();
                rest.remove(s.first.v);
                rest
            }),
            Part::First => at_start
                .then(|| Sketch::new(k.accuracy()).ok())
                .flatten()
                .map(|mut one| {
                    one.add(s.first.v);
                    one
                }),
        }
    }

    /// The summary of one part of the slot (none if it holds no reading).
    pub fn part(&self, part: Part) -> Option<Summary> {
        let s = self.summary?;
        let at_start = s.first.t == self.start;
        match part {
            Part::Whole => Some(s),
            Part::First => at_start.then(|| Summary::one(s.first)),
            Part::Rest if !at_start => Some(s),
            Part::Rest => {
                let r = self.rest?;
                let f = s.first;
                let count = s.count - 1;
                let by = (r.second.t - f.t) as f64;
                let first_moments = Moments::of(f, f.t);
                // The rest's moments about its own first reading.
                let m = Moments {
                    st: s.moments.st - first_moments.st,
                    stt: s.moments.stt - first_moments.stt,
                    stv: s.moments.stv - first_moments.stv,
                    svv: s.moments.svv - first_moments.svv,
                }
                .shifted(-by, count as f64, r.sum);
                Some(Summary {
                    count,
                    sum: r.sum,
                    min: r.min,
                    max: r.max,
                    first: r.second,
                    penult: if count >= 2 { s.penult } else { None },
                    last: s.last,
                    inc: s.inc - counter_step(f.v, r.second.v),
                    resets: s.resets - u32::from(r.second.v < f.v),
                    changes: s.changes - u32::from(r.second.v != f.v),
                    moments: m,
                    // The whole's integrals without the first segment.
                    integrals: match (s.integrals, r.gap) {
                        (Some(i), Some(gap)) => {
                            let head = Integrals::segment(f, r.second);
                            Some(Integrals {
                                step: i.step - head.step,
                                linear: i.linear - head.linear,
                                gap,
                            })
                        }
                        _ => None,
                    },
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Readings at distinct seconds in `[0, span)`, sorted, with values that
    /// sum exactly in any order (multiples of 1/4 in ±64) and some repeats.
    fn samples(span: i64) -> impl Strategy<Value = Vec<Sample>> {
        // Often on a slot's first second, where the parts differ.
        let t = prop_oneof![
            0..span,
            (0..span / 7).prop_map(|k| k * 7),
            (0..span / 60).prop_map(|k| k * 60),
            Just(0),
            Just(1),
        ];
        prop::collection::btree_map(t, -256i32..256, 0..40).prop_map(|m| {
            m.into_iter()
                .map(|(t, v)| Sample {
                    t,
                    v: f64::from(v / 8) / 4.0,
                })
                .collect()
        })
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    fn same(a: &Option<Summary>, b: &Option<Summary>) -> Result<(), TestCaseError> {
        match (a, b) {
            (None, None) => Ok(()),
            (Some(a), Some(b)) => {
                prop_assert_eq!(
                    (a.count, a.sum, a.min, a.max, a.first, a.penult, a.last),
                    (b.count, b.sum, b.min, b.max, b.first, b.penult, b.last)
                );
                prop_assert_eq!((a.inc, a.resets, a.changes), (b.inc, b.resets, b.changes));
                let (x, y) = (a.moments, b.moments);
                prop_assert!(
                    close(x.st, y.st) && close(x.stt, y.stt) && close(x.stv, y.stv),
                    "{:?} {:?}",
                    x,
                    y
                );
                prop_assert_eq!(x.svv, y.svv);
                match (a.integrals, b.integrals) {
                    (Some(x), Some(y)) => prop_assert!(
                        close(x.step, y.step) && close(x.linear, y.linear) && x.gap == y.gap,
                        "{:?} {:?}",
                        x,
                        y
                    ),
                    (x, y) => prop_assert_eq!(x, y),
                }
                Ok(())
            }
            _ => Err(TestCaseError::fail(format!("{a:?} against {b:?}"))),
        }
    }

    proptest! {
        /// Splitting readings anywhere and merging the pieces, in either
        /// order, gives the summary of all of them.
        #[test]
        fn merged_pieces_equal_the_whole(xs in samples(500), cut in 0usize..40) {
            let cut = cut.min(xs.len());
            let (a, b) = xs.split_at(cut);
            let whole = Summary::of(&xs);
            let merged = match (Summary::of(a), Summary::of(b)) {
                (Some(a), Some(b)) => {
                    same(&Some(a.merge(&b)), &Some(b.merge(&a)))?;
                    Some(a.then(&b))
                }
                (a, b) => a.or(b),
            };
            same(&merged, &whole)?;
        }

        /// Every part of a slot equals the summary of the readings in it,
        /// for slots made from readings and from sub-slots alike.
        #[test]
        fn parts_of_a_slot_equal_their_readings(
            xs in samples(600),
            width in prop_oneof![Just(1i64), Just(7), Just(60)],
        ) {
            let start = 0;
            let end = 600;
            let slot = Slot::of(start, &xs, 3).sketched(0.01, &xs);
            let subs: Vec<Slot> = (start..end)
                .step_by(width as usize)
                .map(|s| {
                    let inside: Vec<Sample> =
                        xs.iter().copied().filter(|x| x.t >= s && x.t < s + width).collect();
                    Slot::of(s, &inside, 1).sketched(0.01, &inside)
                })
                .collect();
            let built = Slot::of_slots(start, &subs);
            prop_assert_eq!(built.n, subs.len() as u64);
            // The merged sketch is the readings' own, bin for bin, and so
            // is each part's.
            prop_assert_eq!(&built.sketch, &slot.sketch.clone().filter(|_| !xs.is_empty()));
            for part in [Part::Whole, Part::Rest, Part::First] {
                let (from, to) = match part {
                    Part::Whole => (start, end),
                    Part::Rest => (start + 1, end),
                    Part::First => (start, start + 1),
                };
                let inside: Vec<Sample> =
                    xs.iter().copied().filter(|x| x.t >= from && x.t < to).collect();
                let want = Slot::of(from, &inside, 0).sketched(0.01, &inside).sketch;
                prop_assert_eq!(&built.sketch_part(part), &want, "{:?}", part);
            }
            // One sub-slot with readings but no sketch: the slot has none.
            if let Some(i) = subs.iter().position(|s| s.summary.is_some()) {
                let mut without = subs.clone();
                without[i].sketch = None;
                prop_assert_eq!(Slot::of_slots(start, &without).sketch, None);
            }
            for part in [Part::Whole, Part::Rest, Part::First] {
                let (from, to) = match part {
                    Part::Whole => (start, end),
                    Part::Rest => (start + 1, end),
                    Part::First => (start, start + 1),
                };
                let inside: Vec<Sample> =
                    xs.iter().copied().filter(|x| x.t >= from && x.t < to).collect();
                let want = Summary::of(&inside);
                same(&slot.part(part), &want)?;
                same(&built.part(part), &want)?;
            }
            prop_assert_eq!(built.rest.map(|r| (r.second, r.min, r.max)), slot.rest.map(|r| (r.second, r.min, r.max)));
        }
    }

    #[test]
    fn counter_resets_count_the_new_value_from_zero() {
        let xs: Vec<Sample> = [(0, 5.0), (10, 8.0), (20, 2.0), (30, 2.0), (40, 6.0)]
            .into_iter()
            .map(|(t, v)| Sample { t, v })
            .collect();
        let s = Summary::of(&xs).expect("readings");
        assert_eq!(s.inc, 3.0 + 2.0 + 0.0 + 4.0);
        assert_eq!((s.resets, s.changes), (1, 3));
        assert_eq!(s.penult, Some(Sample { t: 30, v: 2.0 }));
    }

    #[test]
    fn parts_are_whole_slots_or_a_slot_without_or_with_only_its_first_second() {
        assert_eq!(Part::of(60, 120, 0, 200), Some(Part::Whole));
        assert_eq!(Part::of(60, 120, 61, 121), Some(Part::Rest));
        assert_eq!(Part::of(60, 120, 0, 61), Some(Part::First));
        assert_eq!(Part::of(60, 120, 62, 200), None);
        assert_eq!(Part::of(60, 120, 0, 60), None);
        assert_eq!(Part::of(60, 61, 60, 61), Some(Part::Whole));
    }
}

//! Values at instants: what a series answers at a time that may hold no
//! reading (a report's 00:00, an event's time).
//!
//! A reading stands for its value from its time until the next reading, or
//! for the gap limit `G` at most (by default the staleness limit
//! time-weighted averages use, see `domain::weighted`): `previous` takes
//! the reading at or before the instant while it holds (`t < t₁ + G`,
//! exactly where `weighting=time` holds it), and `linear` the line between
//! the readings either side when at most `G` apart (`t₂ − t₁ ≤ G`, exactly
//! where `weighting=linear` joins them). Pure: the caller gives the
//! readings either side.

use super::Sample;

/// The value at `t` of the line through `p` and `n` (`p.t < n.t`).
pub fn interpolate(p: Sample, n: Sample, t: f64) -> f64 {
    let span = (n.t - p.t) as f64;
    if span <= 0.0 {
        return p.v;
    }
    let w = (t - p.t as f64) / span;
    let rise = n.v - p.v;
    if rise.is_finite() {
        p.v + rise * w
    } else {
        // Readings of opposite signs near the largest doubles: their
        // difference overflows, a weighted sum of them does not.
        p.v * (1.0 - w) + n.v * w
    }
}

/// How a value at an instant is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum At {
    /// The reading at or before the instant, while it holds.
    #[default]
    Previous,
    /// The reading at the instant, else the line between the readings
    /// either side when at most the gap limit apart.
    Linear,
}

/// The value at `t`, and the readings it came from, given the last reading
/// at or before `t` (`prev`) and the first after it (`next`).
pub fn value_at(
    how: At,
    max_gap: i64,
    t: i64,
    prev: Option<Sample>,
    next: Option<Sample>,
) -> Option<(f64, Vec<Sample>)> {
    let p = prev.filter(|p| p.t <= t)?;
    if p.t == t {
        return Some((p.v, vec![p]));
    }
    match how {
        At::Previous => (t - p.t < max_gap).then(|| (p.v, vec![p])),
        At::Linear => {
            let n = next.filter(|n| n.t > t && n.t - p.t <= max_gap)?;
            Some((interpolate(p, n, t as f64), vec![p, n]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(t: i64, v: f64) -> Sample {
        Sample { t, v }
    }

    fn readings() -> impl Strategy<Value = Vec<Sample>> {
        proptest::collection::btree_map(0i64..2_000, -50i32..50, 0..40).prop_map(|m| {
            m.into_iter()
                .map(|(t, v)| s(t, f64::from(v) / 4.0))
                .collect()
        })
    }

    proptest! {
        #[test]
        fn a_value_at_an_instant_equals_a_scan_of_every_reading(
            xs in readings(),
            t in 0i64..2_100,
            gap in prop_oneof![1i64..60, 60i64..600, Just(100_000)],
            linear in any::<bool>(),
        ) {
            let prev = xs.iter().rfind(|x| x.t <= t).copied();
            let next = xs.iter().find(|x| x.t > t).copied();
            let how = if linear { At::Linear } else { At::Previous };
            let got = value_at(how, gap, t, prev, next).map(|(v, _)| v);
            let want = match (prev, next) {
                (Some(p), _) if p.t == t => Some(p.v),
                (Some(p), _) if !linear => (t < p.t + gap).then_some(p.v),
                (Some(p), Some(n)) if n.t - p.t <= gap => {
                    Some(p.v + (n.v - p.v) * (t - p.t) as f64 / (n.t - p.t) as f64)
                }
                _ => None,
            };
            match (got, want) {
                (Some(g), Some(w)) => prop_assert!((g - w).abs() <= 1e-9 * w.abs().max(1.0)),
                _ => prop_assert_eq!(got, want),
            }
        }
    }

    #[test]
    fn a_line_between_readings_near_the_largest_doubles_stays_finite() {
        let (p, n) = (s(0, -1e308), s(10, 1e308));
        let v = interpolate(p, n, 5.0);
        assert!(v.is_finite() && v.abs() < 1e293, "{v}");
    }
}

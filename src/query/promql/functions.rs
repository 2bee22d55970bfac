//! PromQL's functions, pure: what a range function makes of a window's
//! readings (from their summary, or their values), and the functions of
//! one value. Prometheus 3's semantics, checked against Prometheus itself
//! in the tests.

use crate::domain::{Agg, Sample, Sketch, Summary};

use super::ast::RangeFunc;

/// A window `(start, end]` (milliseconds) and what its readings give.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    pub start_ms: i64,
    pub end_ms: i64,
    pub range_ms: i64,
    pub agg: &'a Agg,
    pub summary: Option<&'a Summary>,
    /// Every reading, in time order (for quantiles).
    pub samples: &'a [Sample],
}

/// The value of `func` over one window, if it has one.
pub fn range_value(func: RangeFunc, w: &Window<'_>, param: f64) -> Option<f64> {
    let a = w.agg;
    if a.count == 0 {
        return None;
    }
    let s = w.summary;
    Some(match func {
        RangeFunc::Avg => a.sum / a.count as f64,
        RangeFunc::Sum => a.sum,
        RangeFunc::Min => a.min,
        RangeFunc::Max => a.max,
        RangeFunc::Count => a.count as f64,
        RangeFunc::Present | RangeFunc::Absent => 1.0,
        RangeFunc::Last => s?.last.v,
        RangeFunc::Stddev => variance(s?).sqrt(),
        RangeFunc::Stdvar => variance(s?),
        RangeFunc::Quantile => {
            let mut values: Vec<f64> = w.samples.iter().map(|x| x.v).collect();
            quantile(param, &mut values)
        }
        RangeFunc::Rate => extrapolated(s?, w, true, true)?,
        RangeFunc::Increase => extrapolated(s?, w, true, false)?,
        RangeFunc::Delta => extrapolated(s?, w, false, false)?,
        RangeFunc::Irate => instant(s?, true)?,
        RangeFunc::Idelta => instant(s?, false)?,
        RangeFunc::Deriv => deriv(s?)?,
        RangeFunc::Resets => f64::from(s?.resets),
        RangeFunc::Changes => f64::from(s?.changes),
    })
}

/// The population variance of a window's values.
fn variance(s: &Summary) -> f64 {
    let n = s.count as f64;
    let mean = s.sum / n;
    (s.moments.svv / n - mean * mean).max(0.0)
}

/// `rate`, `increase` and `delta`: the change over the window, counter
/// resets corrected for counters, extrapolated towards the window's ends
/// when the first and last readings are near them (Prometheus'
/// `extrapolatedRate`).
fn extrapolated(s: &Summary, w: &Window<'_>, counter: bool, rate: bool) -> Option<f64> {
    if s.count < 2 {
        return None;
    }
    let (first_t, last_t) = (s.first.t * 1000, s.last.t * 1000);
    let result = if counter { s.inc } else { s.last.v - s.first.v };
    let mut to_start = (first_t - w.start_ms) as f64 / 1000.0;
    let mut to_end = (w.end_ms - last_t) as f64 / 1000.0;
    let sampled = (last_t - first_t) as f64 / 1000.0;
    let average = sampled / (s.count - 1) as f64;
    let threshold = average * 1.1;
    if to_start >= threshold {
        to_start = average / 2.0;
    }
    if counter {
        // A counter does not go below zero: the extrapolation stops where
        // it would reach it.
        let mut to_zero = to_start;
        if result > 0.0 && s.first.v >= 0.0 {
            to_zero = sampled * (s.first.v / result);
        }
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    if to_end >= threshold {
        to_end = average / 2.0;
    }
    let mut factor = if sampled != 0.0 {
        (sampled + to_start + to_end) / sampled
    } else {
        1.0
    };
    if rate {
        factor /= w.range_ms as f64 / 1000.0;
    }
    Some(result * factor)
}

/// `irate` and `idelta`: from the last two readings.
fn instant(s: &Summary, rate: bool) -> Option<f64> {
    let prev = s.penult?;
    let last = s.last;
    let interval = (last.t - prev.t) as f64;
    if interval == 0.0 {
        return None;
    }
    let mut v = if rate && last.v < prev.v {
        // A counter reset: the new value counts from zero.
        last.v
    } else {
        last.v - prev.v
    };
    if rate {
        v /= interval;
    }
    Some(v)
}

/// `deriv`: the least-squares slope, per second.
fn deriv(s: &Summary) -> Option<f64> {
    if s.count < 2 {
        return None;
    }
    if s.changes == 0 {
        return Some(if s.first.v.is_infinite() {
            f64::NAN
        } else {
            0.0
        });
    }
    let n = s.count as f64;
    let m = s.moments;
    let cov = m.stv - m.st * s.sum / n;
    let var = m.stt - m.st * m.st / n;
    Some(cov / var)
}

/// Prometheus' quantile: linear interpolation between the closest ranks.
pub fn quantile(q: f64, values: &mut [f64]) -> f64 {
    if values.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    // NaN first, as Prometheus' `vectorByValueHeap` orders them.
    values.sort_by(|a, b| match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        _ => a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal),
    });
    let n = values.len() as f64;
    let rank = q * (n - 1.0);
    let lower = rank.floor().max(0.0);
    let upper = (lower + 1.0).min(n - 1.0);
    let weight = rank - rank.floor();
    values[lower as usize] * (1.0 - weight) + values[upper as usize] * weight
}

/// [`quantile`] from a sketch of the readings: Prometheus' interpolation
/// between the values at the ranks around `q·(n − 1)`, each within the
/// sketch's accuracy (readings of one sign: the answer too).
pub fn sketch_quantile(q: f64, k: &Sketch) -> Option<f64> {
    let n = k.count();
    if n == 0 {
        return None;
    }
    if q.is_nan() {
        return Some(f64::NAN);
    }
    if q < 0.0 {
        return Some(f64::NEG_INFINITY);
    }
    if q > 1.0 {
        return Some(f64::INFINITY);
    }
    let rank = q * (n - 1) as f64;
    let lower = rank.floor();
    let weight = rank - lower;
    let low = k.at_rank(lower as u64)?;
    let high = k.at_rank(((lower as u64) + 1).min(n - 1))?;
    Some(low * (1.0 - weight) + high * weight)
}

/// Go's `math.Max`: +Inf wins, then NaN, and +0 over -0.
pub fn go_max(a: f64, b: f64) -> f64 {
    if a == f64::INFINITY || b == f64::INFINITY {
        f64::INFINITY
    } else if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == 0.0 && b == 0.0 {
        if a.is_sign_negative() { b } else { a }
    } else if a > b {
        a
    } else {
        b
    }
}

/// Go's `math.Min`: -Inf wins, then NaN, and -0 over +0.
pub fn go_min(a: f64, b: f64) -> f64 {
    if a == f64::NEG_INFINITY || b == f64::NEG_INFINITY {
        f64::NEG_INFINITY
    } else if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == 0.0 && b == 0.0 {
        if a.is_sign_negative() { a } else { b }
    } else if a < b {
        a
    } else {
        b
    }
}

/// Go's `math.Frexp`: `x = frac × 2^exp` with `|frac|` in [½, 1).
fn frexp(x: f64) -> (f64, i32) {
    if x == 0.0 || x.is_nan() || x.is_infinite() {
        return (x, 0);
    }
    let (mut x, mut exp) = (x, 0);
    if x.abs() < f64::MIN_POSITIVE {
        // Subnormal: scale into the normal range first.
        x *= (1u64 << 52) as f64;
        exp = -52;
    }
    let bits = x.to_bits();
    exp += ((bits >> 52) & 0x7ff) as i32 - 1022;
    let frac = f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52));
    (frac, exp)
}

/// Go's `math.Log2` (exact at powers of two), which Prometheus' `log2` calls.
pub fn go_log2(x: f64) -> f64 {
    let (frac, exp) = frexp(x);
    if frac == 0.5 {
        return f64::from(exp - 1);
    }
    frac.ln() * (1.0 / std::f64::consts::LN_2) + f64::from(exp)
}

/// Go's `math.Log10`: `log2(x) × (ln 2 / ln 10)`.
pub fn go_log10(x: f64) -> f64 {
    go_log2(x) * (std::f64::consts::LN_2 / std::f64::consts::LN_10)
}

/// `round(v, to_nearest)`.
pub fn round(v: f64, to_nearest: f64) -> f64 {
    let inverse = 1.0 / to_nearest;
    (v * inverse + 0.5).floor() / inverse
}

/// `sgn`.
pub fn sgn(v: f64) -> f64 {
    if v > 0.0 {
        1.0
    } else if v < 0.0 {
        -1.0
    } else {
        v
    }
}

/// The calendar functions of a time in seconds, in UTC.
pub fn calendar(func: super::ast::Func, secs: f64) -> f64 {
    use super::ast::Func;
    let Ok(t) = jiff::Timestamp::from_second(secs.floor() as i64) else {
        return f64::NAN;
    };
    let d = t.to_zoned(jiff::tz::TimeZone::UTC);
    f64::from(match func {
        Func::DayOfWeek => i32::from(d.weekday().to_sunday_zero_offset()),
        Func::DayOfMonth => i32::from(d.day()),
        Func::DayOfYear => i32::from(d.day_of_year()),
        Func::DaysInMonth => i32::from(d.days_in_month()),
        Func::Hour => i32::from(d.hour()),
        Func::Minute => i32::from(d.minute()),
        Func::Month => i32::from(d.month()),
        Func::Year => i32::from(d.year()),
        _ => return f64::NAN,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(points: &[(i64, f64)]) -> Summary {
        let xs: Vec<Sample> = points.iter().map(|&(t, v)| Sample { t, v }).collect();
        Summary::of(&xs).expect("readings")
    }

    fn window<'a>(s: &'a Summary, agg: &'a Agg, start: i64, end: i64) -> Window<'a> {
        Window {
            start_ms: start * 1000,
            end_ms: end * 1000,
            range_ms: (end - start) * 1000,
            agg,
            summary: Some(s),
            samples: &[],
        }
    }

    fn agg_of(s: &Summary) -> Agg {
        Agg {
            count: s.count,
            sum: s.sum,
            min: s.min,
            max: s.max,
        }
    }

    #[test]
    fn increase_extrapolates_to_the_window_and_corrects_resets() {
        // A counter every 10 s over (0, 60], a reset at 40.
        let s = summary(&[
            (5, 100.0),
            (15, 110.0),
            (25, 120.0),
            (35, 130.0),
            (45, 5.0),
            (55, 15.0),
        ]);
        let a = agg_of(&s);
        let w = window(&s, &a, 0, 60);
        // 30 before the reset, 5 + 10 after: 45 over 50 s of samples,
        // extrapolated by 5 s at each end: × 60 / 50.
        let inc = range_value(RangeFunc::Increase, &w, 0.0).expect("a value");
        assert!((inc - 45.0 * 60.0 / 50.0).abs() < 1e-9, "{inc}");
        let rate = range_value(RangeFunc::Rate, &w, 0.0).expect("a value");
        assert!((rate - inc / 60.0).abs() < 1e-12);
        assert_eq!(range_value(RangeFunc::Resets, &w, 0.0), Some(1.0));
        assert_eq!(range_value(RangeFunc::Irate, &w, 0.0), Some(1.0));
        assert_eq!(range_value(RangeFunc::Idelta, &w, 0.0), Some(10.0));
        let delta = range_value(RangeFunc::Delta, &w, 0.0).expect("a value");
        assert!((delta - (15.0 - 100.0) * 60.0 / 50.0).abs() < 1e-9);
    }

    /// Prometheus 3 falls back to half an interval at the start before it
    /// stops at the counter's zero point; Prometheus 2 did it the other way
    /// round (and answered 77.57081280788178 here).
    #[test]
    fn a_counter_near_zero_is_extrapolated_as_prometheus_3_does() {
        let base = 1_795_464_420;
        let s = summary(&[
            (base + 81, 9.875),
            (base + 109, 0.25),
            (base + 194, 60.75),
            (base + 238, 44.625),
            (base + 284, -42.625),
        ]);
        let a = agg_of(&s);
        let got = range_value(RangeFunc::Increase, &window(&s, &a, base, base + 300), 0.0)
            .expect("a value");
        assert!((got - 75.53956280788178).abs() < 1e-12, "{got}");
    }

    #[test]
    fn deriv_is_the_least_squares_slope() {
        let s = summary(&[(0, 1.0), (10, 3.0), (20, 5.0), (30, 7.5)]);
        let a = agg_of(&s);
        let got = range_value(RangeFunc::Deriv, &window(&s, &a, -1, 30), 0.0).expect("a value");
        // Least squares by hand: x̄ = 15, ȳ = 4.125, Σ(x−x̄)(y−ȳ) = 107.5, Σ(x−x̄)² = 500.
        assert!((got - 107.5 / 500.0).abs() < 1e-12, "{got}");
        let flat = summary(&[(0, 2.0), (10, 2.0)]);
        let fa = agg_of(&flat);
        assert_eq!(
            range_value(RangeFunc::Deriv, &window(&flat, &fa, -1, 10), 0.0),
            Some(0.0)
        );
    }

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let mut v = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(quantile(0.5, &mut v), 2.5);
        assert_eq!(quantile(0.0, &mut v), 1.0);
        assert_eq!(quantile(1.5, &mut v), f64::INFINITY);
        assert!(quantile(0.5, &mut []).is_nan());
    }

    #[test]
    fn the_variance_is_the_population_variance() {
        let s = summary(&[
            (0, 2.0),
            (1, 4.0),
            (2, 4.0),
            (3, 4.0),
            (4, 5.0),
            (5, 5.0),
            (6, 7.0),
            (7, 9.0),
        ]);
        let a = agg_of(&s);
        let w = window(&s, &a, -1, 7);
        assert_eq!(range_value(RangeFunc::Stdvar, &w, 0.0), Some(4.0));
        assert_eq!(range_value(RangeFunc::Stddev, &w, 0.0), Some(2.0));
    }

    #[test]
    fn logarithms_are_computed_as_go_computes_them() {
        assert_eq!(go_log2(8.0), 3.0);
        assert_eq!(go_log2(0.0), f64::NEG_INFINITY);
        assert!(go_log2(-1.0).is_nan());
        assert_eq!(go_log2(f64::INFINITY), f64::INFINITY);
        assert_eq!(go_log2(f64::MIN_POSITIVE / 4.0), -1024.0);
        assert!((go_log10(1000.0) - 3.0).abs() < 1e-15);
        // Prometheus answered this for log10(57.375).
        assert_eq!(go_log10(57.375), 1.7587226985453175);
    }

    #[test]
    fn rounding_and_calendars_follow_prometheus() {
        assert_eq!(round(2.5, 1.0), 3.0);
        assert_eq!(round(-2.5, 1.0), -2.0);
        assert_eq!(round(7.3, 5.0), 5.0);
        use super::super::ast::Func;
        // 2026-11-23 is a Monday.
        assert_eq!(calendar(Func::DayOfWeek, 1_795_392_000.0), 1.0);
        assert_eq!(calendar(Func::DaysInMonth, 1_795_392_000.0), 30.0);
        assert_eq!(calendar(Func::Year, 0.0), 1970.0);
    }
}

//! The points of a result: fixed steps aligned to the epoch, or calendar
//! steps (days, weeks from Monday, months) aligned to local midnight in a
//! time zone, where a day lasts 23 or 25 hours across a daylight-saving change.

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// A calendar step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calendar {
    Day,
    /// From Monday.
    Week,
    Month,
}

/// Point `i` covers `[start(i), start(i + 1))`, clipped to the queried range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grid {
    Uniform {
        origin: i64,
        step: i64,
        points: usize,
    },
    /// Boundaries in epoch seconds, ascending: one more than there are points.
    Bounds(Vec<i64>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GridError {
    #[error("the range holds more than {0} steps")]
    TooManyPoints(usize),
    #[error("the range lies beyond the representable times")]
    OutOfRange,
}

impl Grid {
    /// One point for the whole range (an average).
    pub fn whole(from: i64, to: i64) -> Self {
        Self::Uniform {
            origin: from,
            step: (to - from).max(1),
            points: 1,
        }
    }

    /// Steps aligned to multiples of `step` since the epoch, so the same step
    /// always yields the same point boundaries.
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
        Self::Uniform {
            origin,
            step,
            points,
        }
    }

    /// Calendar steps in `tz` covering `[from, to)`, starting at the local
    /// midnight (Monday, first of the month) at or before `from`.
    pub fn calendar(
        from: i64,
        to: i64,
        step: Calendar,
        tz: &TimeZone,
        max_points: usize,
    ) -> Result<Self, GridError> {
        let local = Timestamp::from_second(from)
            .map_err(|_| GridError::OutOfRange)?
            .to_zoned(tz.clone())
            .date();
        let first = match step {
            Calendar::Day => local,
            Calendar::Week => local
                .checked_sub(i64::from(local.weekday().to_monday_zero_offset()).days())
                .map_err(|_| GridError::OutOfRange)?,
            Calendar::Month => local.first_of_month(),
        };
        let midnight = |d: Date| -> Result<i64, GridError> {
            d.to_zoned(tz.clone())
                .map(|z| z.timestamp().as_second())
                .map_err(|_| GridError::OutOfRange)
        };
        let mut bounds = vec![midnight(first)?];
        let mut i: i64 = 0;
        while bounds.last().is_some_and(|&b| b < to) {
            if bounds.len() > max_points {
                return Err(GridError::TooManyPoints(max_points));
            }
            i += 1;
            let next = match step {
                Calendar::Day => first.checked_add(i.days()),
                Calendar::Week => first.checked_add((7 * i).days()),
                Calendar::Month => first.checked_add(i.months()),
            }
            .map_err(|_| GridError::OutOfRange)?;
            bounds.push(midnight(next)?);
        }
        Ok(Self::Bounds(bounds))
    }

    pub fn points(&self) -> usize {
        match self {
            Grid::Uniform { points, .. } => *points,
            Grid::Bounds(b) => b.len().saturating_sub(1),
        }
    }

    /// The start of point `i`, epoch seconds, if representable.
    pub fn start(&self, i: usize) -> Option<i64> {
        match self {
            Grid::Uniform { origin, step, .. } => i64::try_from(i)
                .ok()?
                .checked_mul(*step)?
                .checked_add(*origin),
            Grid::Bounds(b) => b.get(i).copied(),
        }
    }

    /// The point holding second `ts`, if any.
    pub fn point(&self, ts: i64) -> Option<usize> {
        match self {
            Grid::Uniform {
                origin,
                step,
                points,
            } => {
                if ts < *origin {
                    return None;
                }
                let p = usize::try_from((ts - origin) / step).ok()?;
                (p < *points).then_some(p)
            }
            Grid::Bounds(b) => {
                let i = b.partition_point(|&x| x <= ts);
                (i > 0 && i < b.len()).then(|| i - 1)
            }
        }
    }

    /// The point that `[start, end)` falls in entirely, if it does not straddle one.
    pub fn single_point(&self, start: i64, end: i64) -> Option<usize> {
        let p = self.point(start)?;
        (self.point(end - 1) == Some(p)).then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tz(name: &str) -> TimeZone {
        TimeZone::get(name).expect("bundled")
    }

    fn ts(s: &str) -> i64 {
        s.parse::<Timestamp>().expect("timestamp").as_second()
    }

    #[test]
    fn grids_survive_extreme_steps_and_ranges() {
        let g = Grid::aligned(i64::MAX - 10, i64::MAX, i64::MAX);
        assert_eq!(g.points(), 1);
        let g = Grid::aligned(i64::MIN + 1, i64::MAX, 60);
        assert!(g.points() > 0);
        assert_eq!(Grid::aligned(100, 50, 60).points(), 0);
        assert_eq!(
            Grid::calendar(i64::MAX - 10, i64::MAX, Calendar::Day, &TimeZone::UTC, 10),
            Err(GridError::OutOfRange)
        );
    }

    #[test]
    fn fixed_steps_align_to_the_epoch() {
        let grid = Grid::aligned(3 * 60 + 10, 11 * 60, 5 * 60);
        assert_eq!(
            grid,
            Grid::Uniform {
                origin: 0,
                step: 300,
                points: 3
            }
        );
        assert_eq!(grid.point(299), Some(0));
        assert_eq!(grid.point(900), None);
        assert_eq!(grid.single_point(240, 360), None);
    }

    #[test]
    fn berlin_days_last_23_and_25_hours_across_daylight_saving() {
        let berlin = tz("Europe/Berlin");
        let g = Grid::calendar(
            ts("2026-03-28T12:00:00Z"),
            ts("2026-03-30T00:00:00Z"),
            Calendar::Day,
            &berlin,
            100,
        )
        .expect("grid");
        let Grid::Bounds(b) = &g else {
            panic!("calendar")
        };
        assert_eq!(b[0], ts("2026-03-27T23:00:00Z"), "midnight at +01:00");
        assert_eq!(b[2] - b[1], 23 * 3600, "29 March has 23 hours");
        let g = Grid::calendar(
            ts("2026-10-25T00:00:00Z"),
            ts("2026-10-25T12:00:00Z"),
            Calendar::Day,
            &berlin,
            100,
        )
        .expect("grid");
        let Grid::Bounds(b) = &g else {
            panic!("calendar")
        };
        assert_eq!(
            b,
            &vec![ts("2026-10-24T22:00:00Z"), ts("2026-10-25T23:00:00Z")]
        );
        assert_eq!(b[1] - b[0], 25 * 3600, "25 October has 25 hours");
    }

    #[test]
    fn weeks_start_on_monday_and_months_on_the_first() {
        let ny = tz("America/New_York");
        // 2026-11-22 is a Sunday.
        let g = Grid::calendar(
            ts("2026-11-22T12:00:00Z"),
            ts("2026-11-24T00:00:00Z"),
            Calendar::Week,
            &ny,
            10,
        )
        .expect("grid");
        assert_eq!(g.start(0), Some(ts("2026-11-16T05:00:00Z")));
        assert_eq!(g.start(1), Some(ts("2026-11-23T05:00:00Z")));
        let g = Grid::calendar(
            ts("2026-02-10T00:00:00Z"),
            ts("2026-04-01T00:00:00Z"),
            Calendar::Month,
            &TimeZone::UTC,
            10,
        )
        .expect("grid");
        assert_eq!(g.points(), 2);
        assert_eq!(g.start(1), Some(ts("2026-03-01T00:00:00Z")));
        assert_eq!(
            Grid::calendar(0, 86_400 * 30, Calendar::Day, &TimeZone::UTC, 10),
            Err(GridError::TooManyPoints(10))
        );
    }
}

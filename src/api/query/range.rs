//! The parameters every query route shares: instants, steps, time zones,
//! the range in whole stored seconds and the grid of its points.

use jiff::tz::TimeZone;

use super::Point;
use crate::api::params::Params;
use crate::api::{ApiError, AppState};
use crate::domain::{Agg, MetricName};
use crate::query::{Calendar, Grid, GridError};

/// Epoch milliseconds from RFC 3339 text or an integer, in the years 0000
/// to 9999.
pub fn parse_instant(name: &str, s: &str) -> Result<i64, ApiError> {
    let ms = match s.parse::<i64>() {
        Ok(ms) => ms,
        Err(_) => crate::domain::rfc3339_ms(s).ok_or_else(|| {
            ApiError::bad_request(format!(
                "{name} must be an RFC 3339 timestamp (0000-01-01 to 9999-12-30) or integer epoch milliseconds"
            ))
        })?,
    };
    crate::domain::representable_ms(ms).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{name} must lie between 0000-01-01 and 9999-12-30 (the instants an answer can write)"
        ))
    })
}

pub(crate) fn format_ms(ms: i64) -> String {
    crate::domain::format_ms(ms).unwrap_or_else(|| ms.to_string())
}

/// A point's start: UTC as `…Z`, or with the offset of `tz` when asked for one.
pub(crate) fn format_start(secs: i64, tz: Option<&TimeZone>) -> Result<String, ApiError> {
    let out_of_range = || ApiError::bad_request("the range lies beyond the representable times");
    match tz {
        None => Ok(format_ms(secs.checked_mul(1000).ok_or_else(out_of_range)?)),
        Some(tz) => jiff::Timestamp::from_second(secs)
            .map(|t| {
                t.to_zoned(tz.clone())
                    .strftime("%Y-%m-%dT%H:%M:%S%:z")
                    .to_string()
            })
            .map_err(|_| out_of_range()),
    }
}

/// A step: calendar (`1d`, `1w` from Monday, `1mo`, aligned to local
/// midnight in `tz`) or a whole number of minutes aligned to the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Fixed(i64),
    Calendar(Calendar),
}

pub fn parse_step(s: &str) -> Result<Step, ApiError> {
    match s {
        "1d" => return Ok(Step::Calendar(Calendar::Day)),
        "1w" => return Ok(Step::Calendar(Calendar::Week)),
        "1mo" => return Ok(Step::Calendar(Calendar::Month)),
        _ => {}
    }
    humantime::parse_duration(s)
        .ok()
        .and_then(|d| {
            i64::try_from(d.as_secs())
                .ok()
                .filter(|_| d.subsec_nanos() == 0)
        })
        .filter(|&secs| secs > 0 && secs % 60 == 0)
        .map(Step::Fixed)
        .ok_or_else(|| {
            ApiError::bad_request(
                "step must be 1d, 1w, 1mo or a whole number of minutes, such as 1m, 5m, 15m or 1h",
            )
        })
}

pub(crate) fn parse_tz(params: &Params) -> Result<Option<(String, TimeZone)>, ApiError> {
    params
        .get("tz")
        .map(|name| {
            TimeZone::get(name)
                .map(|tz| (name.to_owned(), tz))
                .map_err(|_| {
                    ApiError::bad_request(format!(
                        "tz {name:?} is not an IANA time zone name such as Europe/Berlin or UTC"
                    ))
                })
        })
        .transpose()
}

/// A validated range: as asked, and in whole stored seconds.
pub(crate) struct Range {
    pub(crate) from_ms: i64,
    pub(crate) to_ms: i64,
    /// A stored second `s` counts when `from_ms <= s·1000 < to_ms`.
    pub(crate) from: i64,
    pub(crate) to: i64,
}

pub(crate) fn range(state: &AppState, params: &Params) -> Result<Range, ApiError> {
    let from_ms = parse_instant("from", params.require("from")?)?;
    let to_ms = parse_instant("to", params.require("to")?)?;
    if from_ms >= to_ms {
        return Err(ApiError::bad_request("from must be before to"));
    }
    let max = state.settings.query.max_range;
    if u128::try_from(i128::from(to_ms) - i128::from(from_ms)).unwrap_or(u128::MAX)
        > max.as_millis()
    {
        return Err(ApiError::bad_request(format!(
            "the range is longer than {} (query.max_range)",
            humantime::format_duration(max)
        )));
    }
    Ok(Range {
        from_ms,
        to_ms,
        from: from_ms.div_euclid(1000) + i64::from(from_ms.rem_euclid(1000) != 0),
        to: to_ms.div_euclid(1000) + i64::from(to_ms.rem_euclid(1000) != 0),
    })
}

/// An answer over readings older than the buckets' retention: the range it
/// really covers, widened (or, where nothing is kept, narrowed) to the
/// slots of the finest level still kept there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Coarse {
    /// The range the figures cover.
    pub from: String,
    pub to: String,
    /// The finest resolution kept at the range's old end: `1m`, `1h` or `1d`.
    pub resolution: String,
    pub reason: String,
}

fn resolution_name(res: i64) -> &'static str {
    match res {
        60 => "1m",
        3600 => "1h",
        _ => "1d",
    }
}

/// Brings `r` in line with what is kept (see [`Coarse`]): readings older
/// than `retention.buckets` are answered from rollup slots, whole ones only,
/// so the range's ends move out to those slots' edges, and every point of
/// `grid` over them must be whole slots too (else 400: never a silently
/// partial figure). `None` when nothing moved.
pub(crate) fn coarse(
    state: &AppState,
    r: &mut Range,
    grid: Option<&Grid>,
) -> Result<Option<Coarse>, ApiError> {
    let retention = &state.settings.retention;
    if retention.buckets.is_none() || r.from >= r.to {
        return Ok(None);
    }
    let g = state.settings.granularity;
    let now = jiff::Timestamp::now().as_second();
    let at = |t: i64| retention.resolution_at(t, now, g);
    if at(r.from) == Some(1) {
        return Ok(None);
    }
    let (from, to) = (r.from, r.to);
    let new_from = match at(from) {
        Some(res) => from - from.rem_euclid(res),
        // Nothing is kept there: the answer starts where something is.
        None => {
            let oldest = retention.oldest_kept(now).unwrap_or(from);
            oldest + (86_400 - oldest.rem_euclid(86_400)) % 86_400
        }
    };
    let new_to = match at(to - 1) {
        Some(1) | None => to,
        Some(res) => to + (res - to.rem_euclid(res)) % res,
    };
    let new_to = new_to.max(new_from);
    if let Some(grid) = grid {
        for i in 0..grid.points() {
            let (Some(a), b) = (grid.start(i), grid.start(i + 1)) else {
                continue;
            };
            // The piece of the point inside the widened range.
            let (a, b) = (a.max(new_from), b.unwrap_or(new_to).min(new_to));
            if a >= b {
                continue;
            }
            match at(a) {
                Some(1) | None => {}
                Some(res)
                    if a.rem_euclid(res) == 0 && (b.rem_euclid(res) == 0 || at(b) == Some(1)) => {}
                Some(res) => {
                    return Err(ApiError::bad_request(format!(
                        "readings from {} on are kept only as {} figures (retention); ask for a step of whole {} (aligned to them)",
                        format_ms(a.saturating_mul(1000)),
                        resolution_name(res),
                        resolution_name(res)
                    )));
                }
            }
        }
    }
    if (new_from, new_to) == (from, to) {
        return Ok(None);
    }
    r.from = new_from;
    r.to = new_to;
    let res = at(from).or(at(new_from)).unwrap_or(86_400);
    Ok(Some(Coarse {
        from: format_ms(new_from.saturating_mul(1000)),
        to: format_ms(new_to.saturating_mul(1000)),
        resolution: resolution_name(res).to_owned(),
        reason: "readings older than retention.buckets are kept only as rollup figures: the figures cover whole slots of this resolution".to_owned(),
    }))
}

/// CSV answers carry [`Coarse`] as a header: they have no place for it.
pub(crate) fn coarse_header(response: &mut axum::response::Response, coarse: Option<&Coarse>) {
    if let Some(c) = coarse
        && let Ok(v) = axum::http::HeaderValue::from_str(&format!(
            "from={}; to={}; resolution={}",
            c.from, c.to, c.resolution
        ))
    {
        response.headers_mut().insert("x-hourglass-coarse", v);
    }
}

pub(crate) fn metric(params: &Params) -> Result<MetricName<'_>, ApiError> {
    match params.get("metric") {
        Some(m) => MetricName::parse(m).map_err(|e| ApiError::bad_request(e.to_string())),
        None => Ok(MetricName::default_metric()),
    }
}

/// The grid of a series: its step's points over the range.
pub(crate) fn series_grid(
    state: &AppState,
    params: &Params,
    r: &Range,
    tz: Option<&TimeZone>,
) -> Result<Grid, ApiError> {
    let step_text = params.require("step")?;
    let max_points = state.settings.query.max_points;
    let too_many = |points: String| {
        ApiError::bad_request(format!(
            "the range holds {points} steps of {step_text}; the limit is {max_points} (query.max_points)"
        ))
    };
    // The grid spans the requested instants; stored seconds count in [from, to).
    let (from, to) = (r.from_ms.div_euclid(1000), r.to.max(r.from));
    match parse_step(step_text)? {
        Step::Fixed(step) => {
            let max_range = state.settings.query.max_range;
            if u64::try_from(step).unwrap_or(u64::MAX) > max_range.as_secs() {
                return Err(ApiError::bad_request(format!(
                    "step is longer than the longest range, {}",
                    humantime::format_duration(max_range)
                )));
            }
            let grid = Grid::aligned(from, to, step);
            if grid.points() > max_points {
                return Err(too_many(grid.points().to_string()));
            }
            Ok(grid)
        }
        Step::Calendar(c) => Grid::calendar(from, to, c, tz.unwrap_or(&TimeZone::UTC), max_points)
            .map_err(|e| match e {
                GridError::TooManyPoints(_) => too_many("more than that".into()),
                GridError::OutOfRange => ApiError::bad_request(e.to_string()),
            }),
    }
}

pub(crate) fn points_of(
    grid: &Grid,
    aggs: &[Agg],
    tz: Option<&TimeZone>,
) -> Result<Vec<Point>, ApiError> {
    aggs.iter()
        .enumerate()
        .map(|(i, a)| {
            let start = grid.start(i).ok_or_else(|| {
                ApiError::bad_request("the range lies beyond the representable times")
            })?;
            Ok(Point::new(Some(format_start(start, tz)?), a))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_calendar_units_or_whole_minutes() {
        assert_eq!(parse_step("1m").ok(), Some(Step::Fixed(60)));
        assert_eq!(parse_step("15m").ok(), Some(Step::Fixed(900)));
        assert_eq!(parse_step("1h").ok(), Some(Step::Fixed(3600)));
        assert_eq!(parse_step("90m").ok(), Some(Step::Fixed(5400)));
        assert_eq!(parse_step("2d").ok(), Some(Step::Fixed(2 * 86400)));
        assert_eq!(parse_step("1d").ok(), Some(Step::Calendar(Calendar::Day)));
        assert_eq!(parse_step("1w").ok(), Some(Step::Calendar(Calendar::Week)));
        assert_eq!(
            parse_step("1mo").ok(),
            Some(Step::Calendar(Calendar::Month))
        );
        for bad in ["", "0m", "30s", "90s", "1.5m", "m", "-1m", "1 fortnight"] {
            assert!(parse_step(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn instants_are_rfc3339_or_epoch_milliseconds() {
        assert_eq!(parse_instant("from", "1000").ok(), Some(1000));
        assert_eq!(
            parse_instant("from", "1970-01-01T00:00:01.5Z").ok(),
            Some(1500)
        );
        assert!(parse_instant("from", "yesterday").is_err());
        let far = parse_instant("from", "-9223372036854775000").expect_err("out of range");
        assert!(
            far.message.contains("0000-01-01 and 9999-12-30"),
            "{}",
            far.message
        );
        assert_eq!(format_ms(1500), "1970-01-01T00:00:01.5Z");
    }

    #[test]
    fn point_starts_never_overflow() {
        assert!(format_start(i64::MAX / 1000 + 1, None).is_err());
        assert_eq!(
            format_start(60, None).ok().as_deref(),
            Some("1970-01-01T00:01:00Z")
        );
        let berlin = TimeZone::get("Europe/Berlin").expect("bundled");
        assert_eq!(
            format_start(1_774_738_800, Some(&berlin)).ok().as_deref(),
            Some("2026-03-29T00:00:00+01:00")
        );
    }
}

//! Each group's points as every point route answers them: time-weighted
//! when asked (each series with its staleness limit) or plain, with their
//! percentiles when asked.

use jiff::tz::TimeZone;

use super::Point;
use super::evaluation::evaluate_figures;
use super::quantiles::{Quantiles, sketches};
use super::range::{Range, points_of};
use super::weighting::{Weighing, weighted_points, weighted_points_of};
use crate::api::{ApiError, AppState};
use crate::domain::MetricName;
use crate::query::{Grid, Series};

/// What a point route asks, beyond its series.
pub(super) struct Ask<'a> {
    /// The route, as its cost is recorded.
    pub endpoint: &'a str,
    pub metric: &'a MetricName<'a>,
    pub range: &'a Range,
    pub grid: &'a Grid,
    /// The time zone of the points' starts (UTC when none).
    pub zone: Option<&'a TimeZone>,
    pub weighing: Option<Weighing>,
    pub quantiles: Option<&'a Quantiles>,
}

impl<'a> Ask<'a> {
    pub(super) fn new(
        endpoint: &'a str,
        metric: &'a MetricName<'a>,
        range: &'a Range,
        grid: &'a Grid,
        zone: Option<&'a TimeZone>,
        weighing: Option<Weighing>,
        quantiles: Option<&'a Quantiles>,
    ) -> Self {
        Self {
            endpoint,
            metric,
            range,
            grid,
            zone,
            weighing,
            quantiles,
        }
    }
}

/// Each group's points on the grid: `series` are the members, each with
/// its group and its staleness limit (used only when weighted).
pub(super) async fn group_points(
    state: &AppState,
    ask: &Ask<'_>,
    series: &[(Series<'_>, usize, i64)],
    groups: usize,
) -> Result<Vec<Vec<Point>>, ApiError> {
    let grouped: Vec<(Series<'_>, usize)> = series.iter().map(|(s, g, _)| (*s, *g)).collect();
    let (mut points, sketches) = match ask.weighing {
        Some(how) => {
            let figures = weighted_points(
                state,
                ask.endpoint,
                ask.metric,
                ask.range,
                ask.grid,
                series,
                groups,
                how.weighting,
            )
            .await?;
            let points = figures
                .iter()
                .map(|f| weighted_points_of(ask.grid, f, ask.zone))
                .collect::<Result<Vec<_>, _>>()?;
            let sketches = sketches(
                state,
                ask.endpoint,
                ask.metric,
                ask.range,
                ask.grid,
                &grouped,
                groups,
                ask.quantiles,
            )
            .await?;
            (points, sketches)
        }
        None => {
            let f = evaluate_figures(
                state,
                ask.endpoint,
                ask.metric,
                ask.range,
                ask.grid.clone(),
                &grouped,
                groups,
                ask.quantiles.is_some(),
            )
            .await?;
            let points = f
                .aggs
                .iter()
                .map(|a| points_of(ask.grid, a, ask.zone))
                .collect::<Result<Vec<_>, _>>()?;
            (points, f.sketches)
        }
    };
    if let Some(q) = ask.quantiles {
        for (p, k) in points.iter_mut().zip(&sketches) {
            q.annotate(p, k);
        }
    }
    Ok(points)
}

//! `weighting=` and `staleness=`: time-weighted averages and series of one
//! sensor or of groups (`query::weighted`).

use super::Point;
use super::admission::{admit, store_error};
use super::evaluation::{beyond_a_double, check_finite};
use super::range::{Range, points_of};
use crate::api::ApiError;
use crate::api::AppState;
use crate::api::params::Params;
use crate::domain::{Agg, Labels, MetricName, Weighted, Weighting};
use crate::query::weighted::{Weigh, WeightedError, time_weighted_windows};
use crate::query::{Cost, Grid, Need, Question, Series};

/// Series' windows held in memory at once: a group series over many
/// sensors is weighed a slice of sensors at a time, folded into its groups.
const CHUNK_CELLS: usize = 250_000;

/// The request's weighting (`readings`, the default, `time` or `linear`).
pub(crate) fn weighting(params: &Params) -> Result<Weighting, ApiError> {
    match params.get("weighting") {
        None | Some("readings") => Ok(Weighting::Readings),
        Some("time") => Ok(Weighting::Time),
        Some("linear") => Ok(Weighting::Linear),
        Some(_) => Err(ApiError::bad_request(
            "weighting must be readings, time (each value held until the next) or linear",
        )),
    }
}

/// The name a response gives a weighting.
pub(crate) fn weighting_name(w: Weighting) -> &'static str {
    match w {
        Weighting::Readings => "readings",
        Weighting::Time => "time",
        Weighting::Linear => "linear",
    }
}

/// The label that sets a sensor's staleness limit (a duration such as
/// `15m`), where a request gives none.
pub const STALENESS_LABEL: &str = "staleness";

/// A request's time weighting and where its staleness limits come from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Weighing {
    pub(crate) weighting: Weighting,
    /// `staleness=`, in seconds: every sensor's limit.
    asked: Option<i64>,
    /// `query.staleness`, for sensors without a `staleness` label.
    fleet: i64,
    /// `query.max_range`: a label past it is not a limit.
    most: i64,
}

impl Weighing {
    /// Whether every sensor's limit is the request's (no labels needed).
    pub(crate) fn asked(&self) -> bool {
        self.asked.is_some()
    }

    /// A sensor's limit in seconds: the request's, else its `staleness`
    /// label (a duration of whole seconds within `query.max_range`), else
    /// the fleet's.
    pub(crate) fn limit(&self, labels: &Labels) -> i64 {
        self.asked
            .or_else(|| {
                labels
                    .get(STALENESS_LABEL)
                    .and_then(|text| humantime::parse_duration(text).ok())
                    .filter(|d| d.subsec_nanos() == 0)
                    .and_then(|d| i64::try_from(d.as_secs()).ok())
                    .filter(|s| (1..=self.most).contains(s))
            })
            .unwrap_or(self.fleet)
    }

    pub(crate) fn name(&self) -> &'static str {
        weighting_name(self.weighting)
    }
}

/// The request's time weighting; none for `weighting=readings`, which takes
/// no limit. `staleness=` is a duration such as `15m` or `2d`, at most
/// `query.max_range`; without it each sensor's `staleness` label, else
/// `query.staleness`, is its limit.
pub(crate) fn weighing(state: &AppState, params: &Params) -> Result<Option<Weighing>, ApiError> {
    let w = weighting(params)?;
    if w == Weighting::Readings {
        if params.get("staleness").is_some() {
            return Err(ApiError::bad_request(
                "staleness applies only with weighting=time or weighting=linear",
            ));
        }
        return Ok(None);
    }
    staleness(state, params, w).map(Some)
}

/// Where a request's staleness limits come from, for `weighting`:
/// `staleness=`, else each sensor's label, else `query.staleness`.
pub(crate) fn staleness(
    state: &AppState,
    params: &Params,
    weighting: Weighting,
) -> Result<Weighing, ApiError> {
    let q = &state.settings.query;
    let seconds = |d: std::time::Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let asked = match params.get("staleness") {
        None => None,
        Some(text) => Some(
            humantime::parse_duration(text)
                .ok()
                .filter(|d| d.subsec_nanos() == 0 && d.as_secs() >= 1 && *d <= q.max_range)
                .map(seconds)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "staleness must be a duration of whole seconds, at least 1s and at most query.max_range ({}), such as 15m or 2d",
                        humantime::format_duration(q.max_range)
                    ))
                })?,
        ),
    };
    Ok(Weighing {
        weighting,
        asked,
        fleet: seconds(q.staleness).max(1),
        most: seconds(q.max_range),
    })
}

/// The bounds of a grid's points, clipped to the range (a point starting
/// before it, or ending after it, covers only its part).
fn windows(grid: &Grid, r: &Range) -> Result<Vec<i64>, ApiError> {
    (0..=grid.points())
        .map(|i| {
            grid.start(i)
                .map(|s| s.clamp(r.from, r.to.max(r.from)))
                .ok_or_else(|| {
                    ApiError::bad_request("the range lies beyond the representable times")
                })
        })
        .collect()
}

/// Each group's time-weighted figures at each point of `grid` over `r`
/// (its sensors' integrals over their held time together), with its
/// readings' aggregates. `series` are the sensors, their groups and their
/// staleness limits ([`Weighing::limit`]).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn weighted_points(
    state: &AppState,
    endpoint: &str,
    metric: &MetricName<'_>,
    r: &Range,
    grid: &Grid,
    series: &[(Series<'_>, usize, i64)],
    groups: usize,
    weighting: Weighting,
) -> Result<Vec<Vec<(Weighted, Agg)>>, ApiError> {
    let points = grid.points();
    let mut out = vec![vec![(Weighted::default(), Agg::default()); points]; groups];
    if r.from >= r.to || series.is_empty() || points == 0 {
        return Ok(out);
    }
    let windows = windows(grid, r)?;
    let admitted = admit(state).await?;
    let q = Question {
        metric: metric.as_str(),
        from: r.from,
        to: r.to,
        granularity: state.settings.granularity,
        need: Need::Summaries,
        max_time: admitted.max_time(),
        cache: None,
    };
    let how = Weigh {
        weighting,
        now: jiff::Timestamp::now().as_second(),
    };
    let work = async {
        let mut cost = Cost::default();
        for chunk in series.chunks((CHUNK_CELLS / points).max(1)) {
            let members: Vec<Series<'_>> = chunk.iter().map(|(s, _, _)| *s).collect();
            let limits: Vec<i64> = chunk.iter().map(|(_, _, l)| *l).collect();
            let (each, c) = time_weighted_windows(
                state.store.as_ref(),
                &state.batcher,
                q,
                (&members, &limits),
                &windows,
                how,
            )
            .await?;
            cost.documents += c.documents;
            cost.round_trips += c.round_trips;
            for (figures, (_, group, _)) in each.into_iter().zip(chunk) {
                for (into, (w, agg)) in out[*group].iter_mut().zip(figures) {
                    into.0.integral += w.integral;
                    into.0.held += w.held;
                    into.1.merge(&agg);
                }
            }
        }
        Ok::<_, WeightedError>(cost)
    };
    let cost = admitted
        .within(async {
            work.await.map_err(|e| match e {
                WeightedError::Store(e) => store_error(e),
                e @ WeightedError::TooManyReadings => {
                    ApiError::new(axum::http::StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
                }
            })
        })
        .await?;
    admitted.done(state, endpoint, cost);
    let aggs: Vec<Agg> = out.iter().flatten().map(|(_, a)| *a).collect();
    check_finite(&aggs)?;
    if !out.iter().flatten().all(|(w, _)| w.integral.is_finite()) {
        return Err(beyond_a_double());
    }
    Ok(out)
}

/// The points of one group's figures: the readings' aggregates, with `avg`
/// weighted by time and the seconds held.
pub(crate) fn weighted_points_of(
    grid: &Grid,
    figures: &[(Weighted, Agg)],
    tz: Option<&jiff::tz::TimeZone>,
) -> Result<Vec<Point>, ApiError> {
    let aggs: Vec<Agg> = figures.iter().map(|(_, a)| *a).collect();
    let mut points = points_of(grid, &aggs, tz)?;
    for (p, (w, _)) in points.iter_mut().zip(figures) {
        p.avg = w.average();
        p.held_seconds = Some(w.held);
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sensors_limit_is_the_requests_else_its_label_else_the_fleets() {
        let labels = |v: &str| {
            Labels::parse([(STALENESS_LABEL.to_owned(), v.to_owned())].into()).expect("labels")
        };
        let w = Weighing {
            weighting: Weighting::Time,
            asked: None,
            fleet: 86_400,
            most: 400 * 86_400,
        };
        assert_eq!(w.limit(&Labels::default()), 86_400);
        assert_eq!(w.limit(&labels("15m")), 900);
        assert_eq!(w.limit(&labels("90s")), 90);
        // Not a limit: the fleet's.
        for bad in ["soon", "500ms", "0s", "401d"] {
            assert_eq!(w.limit(&labels(bad)), 86_400, "{bad}");
        }
        let asked = Weighing {
            asked: Some(60),
            ..w
        };
        assert!(asked.asked());
        assert_eq!(asked.limit(&labels("15m")), 60);
    }
}

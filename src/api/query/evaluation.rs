//! The one evaluation every point route runs: member series answered and
//! folded into their groups' points, with percentile sketches when asked,
//! and sums beyond a double said so.

use axum::http::StatusCode;

use super::admission::{admit, store_error};
use super::range::Range;
use crate::api::{ApiError, AppState};
use crate::domain::{Agg, MetricName, Sketch};
use crate::query::{Grid, Need, Question, Series};

/// Each group's points: every member series answered, folded into its
/// group's points as its batch finishes.
pub(crate) async fn evaluate(
    state: &AppState,
    endpoint: &str,
    metric: &MetricName<'_>,
    r: &Range,
    grid: Grid,
    series: &[(Series<'_>, usize)],
    groups: usize,
) -> Result<Vec<Vec<Agg>>, ApiError> {
    let figures = evaluate_figures(state, endpoint, metric, r, grid, series, groups, false).await?;
    Ok(figures.aggs)
}

/// Each group's points, and with `sketches` each point's percentile sketch
/// (none for a point without readings).
pub(crate) struct Figures {
    pub aggs: Vec<Vec<Agg>>,
    pub sketches: Vec<Vec<Option<Sketch>>>,
}

/// Points (over all groups) one answer with quantiles may hold: a point's
/// sketch may hold thousands of bins.
const MAX_SKETCHED_POINTS: usize = 100_000;

/// [`evaluate`], with each point's sketch when `sketches` is set.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn evaluate_figures(
    state: &AppState,
    endpoint: &str,
    metric: &MetricName<'_>,
    r: &Range,
    grid: Grid,
    series: &[(Series<'_>, usize)],
    groups: usize,
    sketches: bool,
) -> Result<Figures, ApiError> {
    let points = grid.points();
    if sketches && points.saturating_mul(groups) > MAX_SKETCHED_POINTS {
        return Err(ApiError::bad_request(format!(
            "quantiles= over more than {MAX_SKETCHED_POINTS} points (groups times steps): ask for a longer step or fewer groups"
        )));
    }
    let mut out = Figures {
        aggs: vec![vec![Agg::default(); points]; groups],
        sketches: if sketches {
            vec![vec![None; points]; groups]
        } else {
            Vec::new()
        },
    };
    if r.from >= r.to || series.is_empty() {
        return Ok(out);
    }
    let admitted = admit(state).await?;
    let q = Question {
        metric: metric.as_str(),
        from: r.from,
        to: r.to,
        granularity: state.settings.granularity,
        need: if sketches {
            Need::Sketches
        } else {
            Need::Aggregates
        },
        max_time: admitted.max_time(),
        cache: crate::api::cache_use(state),
    };
    let members: Vec<Series<'_>> = series.iter().map(|(s, _)| *s).collect();
    let work = crate::query::evaluate(
        state.store.as_ref(),
        &state.batcher,
        q,
        grid,
        &members,
        |i, cells| {
            let group = series[i].1;
            for (into, cell) in out.aggs[group].iter_mut().zip(&cells) {
                into.merge(&cell.agg);
            }
            if let Some(into) = out.sketches.get_mut(group) {
                for (into, cell) in into.iter_mut().zip(cells) {
                    match (into.as_mut(), cell.sketch) {
                        (Some(all), Some(k)) => {
                            // Sketches of one accuracy, the store's: they merge.
                            let _ = all.merge(&k);
                        }
                        (None, k) => *into = k,
                        (Some(_), None) => {}
                    }
                }
            }
        },
    );
    let cost = admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(state, endpoint, cost);
    for p in &out.aggs {
        check_finite(p)?;
    }
    Ok(out)
}

/// Finite readings can still add up beyond a double: say so rather than
/// answer a sum of `null`.
pub(crate) fn check_finite(aggs: &[Agg]) -> Result<(), ApiError> {
    if aggs.iter().all(|a| a.sum.is_finite()) {
        return Ok(());
    }
    Err(beyond_a_double())
}

/// A sum (of readings, or of a time integral) beyond a double.
pub(crate) fn beyond_a_double() -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "the sum of the readings in the range is beyond the range of a double; query a shorter range or smaller steps",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_beyond_a_double_is_a_clear_error_not_null() {
        let mut a = Agg::default();
        a.add(f64::MAX);
        a.add(f64::MAX);
        let err = check_finite(&[Agg::default(), a]).expect_err("overflowed");
        assert_eq!(err.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(check_finite(&[Agg::default()]).is_ok());
    }
}

//! Time-weighted averages of series over consecutive windows (one window
//! for an average, a step's points for a series), from the coarsest pieces
//! that answer them exactly.
//!
//! A rollup slot or bucket keeps its run's time integrals with every gap
//! counted ([`crate::domain::Integrals`]), so a piece whose longest gap is
//! within the staleness limit is weighed whole. Each window is read as one
//! piece, with the limit's span before the first for the value carried in
//! (and after the last for the reading a line runs to); a window carries in
//! the last reading of the pieces before it. Where a window holds a longer
//! gap, it is read again in hours, and an hour that still holds one (a
//! limit under an hour, or a slot stored before integrals were kept) is
//! read reading by reading.

use crate::batcher::driver::BatcherHandle;
use crate::domain::{Agg, Sample, Summary, TimeFold, Weighted, Weighting};
use crate::store::{MongoStore, StoreError};

use super::engine::{Cost, Question, Series, evaluate};
use super::plan::Cell;
use super::{Grid, MAX_VALUES_SECONDS, Need};

const DAY: i64 = 86_400;
const HOUR: i64 = 3_600;

/// Why a time-weighted average has no answer.
#[derive(Debug, thiserror::Error)]
pub enum WeightedError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Hours over more than [`MAX_VALUES_SECONDS`] need their readings.
    #[error(
        "the range holds gaps longer than the staleness limit over more than 31 days of hours; ask for a longer staleness or a shorter range"
    )]
    TooManyReadings,
}

/// How the windows are weighed: the weighting, and now (time after it
/// holds nothing yet, unless readings were sent for it).
#[derive(Debug, Clone, Copy)]
pub struct Weigh {
    pub weighting: Weighting,
    pub now: i64,
}

/// [`Weigh`] for one series: with its staleness limit in seconds.
#[derive(Debug, Clone, Copy)]
struct Limit {
    weighting: Weighting,
    staleness: i64,
    now: i64,
}

/// Each series' figures in each window `[windows[i], windows[i + 1])`
/// (bounds in ascending order; an empty window has none; `q.from`, `q.to`
/// and `q.need` are ignored), each series with its staleness limit in
/// seconds (`limits`, one per series). The first stage reads every series
/// at once; a series with windows holding a gap over its limit goes on
/// alone, its windows together.
pub async fn time_weighted_windows(
    store: &MongoStore,
    batcher: &BatcherHandle,
    q: Question<'_>,
    (series, limits): (&[Series<'_>], &[i64]),
    windows: &[i64],
    how: Weigh,
) -> Result<(Vec<Vec<(Weighted, Agg)>>, Cost), WeightedError> {
    let mut distinct = windows.to_vec();
    distinct.dedup();
    let (each, cost) = weigh(store, batcher, q, (series, limits), &distinct, how).await?;
    let out = each
        .into_iter()
        .map(|figures| {
            let mut figures = figures.into_iter();
            windows
                .windows(2)
                .map(|w| {
                    if w[0] < w[1] {
                        figures.next().unwrap_or_default()
                    } else {
                        Default::default()
                    }
                })
                .collect()
        })
        .collect();
    Ok((out, cost))
}

/// [`time_weighted_windows`] over strictly ascending bounds.
async fn weigh(
    store: &MongoStore,
    batcher: &BatcherHandle,
    q: Question<'_>,
    (series, limits): (&[Series<'_>], &[i64]),
    windows: &[i64],
    how: Weigh,
) -> Result<(Vec<Vec<(Weighted, Agg)>>, Cost), WeightedError> {
    let n = windows.len().saturating_sub(1);
    let mut out = vec![vec![(Weighted::default(), Agg::default()); n]; series.len()];
    let mut cost = Cost::default();
    if n == 0 || series.is_empty() {
        return Ok((out, cost));
    }
    let limit = |i: usize| Limit {
        weighting: how.weighting,
        staleness: limits.get(i).copied().unwrap_or(1).max(1),
        now: how.now,
    };
    let longest = (0..series.len())
        .map(|i| limit(i).staleness)
        .max()
        .unwrap_or(1);
    let (from, to) = (windows[0], windows[n]);
    // A reading before the longest limit's span holds nothing in the range,
    // and one after it is joined to nothing: the spans are widened to whole
    // days, each a slot of a rollup. Only a line needs the reading after.
    let lead = from.saturating_sub(longest);
    let mut bounds = Vec::with_capacity(n + 3);
    bounds.push(lead.saturating_sub(lead.rem_euclid(DAY)));
    bounds.extend_from_slice(windows);
    if how.weighting == Weighting::Linear {
        let tail = to.saturating_add(longest);
        bounds.push(tail.saturating_add((DAY - tail.rem_euclid(DAY)) % DAY));
    }
    let whole = Question {
        from: bounds[0],
        to: bounds[bounds.len() - 1],
        need: Need::Summaries,
        cache: None,
        ..q
    };
    let mut pending: Vec<(usize, Vec<Pending>)> = Vec::new();
    let c = evaluate(
        store,
        batcher,
        whole,
        Grid::Bounds(bounds),
        series,
        |i, cells| {
            let mut later = Vec::new();
            for (k, window) in first_stage(&cells, windows, limit(i))
                .into_iter()
                .enumerate()
            {
                out[i][k].1 = window.1;
                match window.0 {
                    Window::Done(w) => out[i][k].0 = w,
                    Window::Finer(p) => later.push(p),
                }
            }
            if !later.is_empty() {
                pending.push((i, later));
            }
        },
    )
    .await?;
    add(&mut cost, c);
    for (i, later) in pending {
        let (done, c) = finer(store, batcher, q, series[i], later).await?;
        add(&mut cost, c);
        for (k, w) in done {
            out[i][k].0 = w;
        }
    }
    Ok((out, cost))
}

/// A window to read again in finer pieces.
#[derive(Debug)]
struct Pending {
    /// Its index.
    window: usize,
    from: i64,
    to: i64,
    fold: TimeFold,
    /// The series' first reading after it.
    after: Option<Sample>,
}

#[derive(Debug)]
enum Window {
    Done(Weighted),
    Finer(Pending),
}

/// One series' windows from its cells (the span before the first window,
/// each window, then for lines the span after the last): each weighed
/// whole where it can be.
fn first_stage(cells: &[Cell], windows: &[i64], how: Limit) -> Vec<(Window, Agg)> {
    let n = windows.len() - 1;
    let summary = |k: usize| cells.get(k).and_then(|c| c.summary);
    // Time after now holds nothing yet, unless readings were sent for it.
    let newest = (1..=n).rev().find_map(summary).map(|s| s.last.t);
    let limit = match newest {
        Some(t) if t >= how.now => i64::MAX,
        _ => how.now.saturating_add(1),
    };
    // The first reading after each cell, from the back.
    let mut after = vec![None; n + 2];
    for k in (0..n + 1).rev() {
        after[k] = summary(k + 1).map(|s| s.first).or(after[k + 1]);
    }
    let mut carried: Option<Sample> = summary(0).map(|s| s.last);
    let mut out = Vec::with_capacity(n);
    for k in 1..=n {
        let (a, b) = (windows[k - 1], windows[k]);
        let end = b.min(limit).max(a);
        let mut fold = TimeFold::new(how.weighting, how.staleness, a, end, carried);
        let piece = summary(k);
        let window = match piece.map(|p| fold.push(&p)) {
            Some(Err(_)) => Window::Finer(Pending {
                window: k - 1,
                from: a,
                to: b,
                fold,
                after: after[k],
            }),
            _ => Window::Done(fold.finish(after[k])),
        };
        out.push((window, cells.get(k).map(|c| c.agg).unwrap_or_default()));
        carried = piece.map(|p| p.last).or(carried);
    }
    out
}

/// One series' windows again, in hours: each is weighed whole where it can
/// be, and reading by reading where not. Two reads whatever the number of
/// windows.
async fn finer(
    store: &MongoStore,
    batcher: &BatcherHandle,
    q: Question<'_>,
    one: Series<'_>,
    pending: Vec<Pending>,
) -> Result<(Vec<(usize, Weighted)>, Cost), WeightedError> {
    // Long: two reads (the windows' hours, then their readings) and the weighing of each window between them.
    let series = [one];
    let mut cost = Cost::default();
    // Every window's hours; cells between windows are read but not used.
    let mut bounds: Vec<i64> = Vec::new();
    for p in &pending {
        let hours = Grid::aligned(p.from, p.to, HOUR);
        bounds.extend(
            (0..=hours.points())
                .filter_map(|i| hours.start(i))
                .map(|s| s.clamp(p.from, p.to)),
        );
    }
    bounds.dedup();
    let hourly = Question {
        from: bounds[0],
        to: bounds[bounds.len() - 1],
        need: Need::Summaries,
        cache: None,
        ..q
    };
    let mut cells = Vec::new();
    let c = evaluate(
        store,
        batcher,
        hourly,
        Grid::Bounds(bounds.clone()),
        &series,
        |_, got| cells = got,
    )
    .await?;
    add(&mut cost, c);
    // The cells of each window.
    let spans: Vec<std::ops::Range<usize>> = pending
        .iter()
        .map(|p| {
            let at = |t: i64| bounds.partition_point(|&b| b < t);
            at(p.from)..at(p.to)
        })
        .collect();
    let whole = |s: &Option<Summary>, fold: &TimeFold| s.is_none_or(|s| fold.takes(&s));
    let finer: Vec<usize> = pending
        .iter()
        .zip(&spans)
        .flat_map(|(p, span)| span.clone().filter(|&k| !whole(&cells[k].summary, &p.fold)))
        .collect();
    let mut readings: Vec<Sample> = Vec::new();
    if let (Some(&a), Some(&b)) = (finer.first(), finer.last()) {
        let (a, b) = (bounds[a], bounds[b + 1]);
        if b - a > MAX_VALUES_SECONDS {
            return Err(WeightedError::TooManyReadings);
        }
        let values = Question {
            from: a,
            to: b,
            need: Need::Values,
            cache: None,
            ..q
        };
        let c = evaluate(
            store,
            batcher,
            values,
            Grid::whole(a, b),
            &series,
            |_, got| {
                readings = got.into_iter().flat_map(|c| c.samples).collect();
            },
        )
        .await?;
        add(&mut cost, c);
    }
    let mut out = Vec::with_capacity(pending.len());
    let mut next = 0;
    for (mut p, span) in pending.into_iter().zip(spans) {
        for k in span {
            let Some(s) = &cells[k].summary else { continue };
            if finer.binary_search(&k).is_err() && p.fold.push(s).is_ok() {
                continue;
            }
            // The hour's readings, in order.
            let (a, b) = (bounds[k], bounds[k + 1]);
            while let Some(&x) = readings.get(next).filter(|x| x.t < b) {
                if x.t >= a {
                    p.fold.push_sample(x);
                }
                next += 1;
            }
        }
        out.push((p.window, p.fold.finish(p.after)));
    }
    Ok((out, cost))
}

fn add(cost: &mut Cost, c: Cost) {
    cost.documents += c.documents;
    cost.round_trips += c.round_trips;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::weighted_model::{brute, close, samples};
    use proptest::prelude::*;

    /// The cells an evaluation would hand over: the readings in each span.
    fn cells(xs: &[Sample], bounds: &[i64]) -> Vec<Cell> {
        bounds
            .windows(2)
            .map(|w| {
                let inside: Vec<Sample> = xs
                    .iter()
                    .copied()
                    .filter(|x| x.t >= w[0] && x.t < w[1])
                    .collect();
                let summary = Summary::of(&inside);
                Cell {
                    agg: summary.map(|s| s.agg()).unwrap_or_default(),
                    summary,
                    samples: inside,
                    sketch: None,
                }
            })
            .collect()
    }

    proptest! {
        /// Consecutive windows, each carrying in the reading before it and
        /// running a line to the one after, weigh as the second-by-second
        /// model does window by window: whole where the first stage takes
        /// a window, reading by reading where it does not.
        #[test]
        fn windows_weigh_as_every_second_does(
            xs in samples(),
            from in 0i64..1500,
            steps in prop::collection::vec(1i64..300, 1..12),
            staleness in prop_oneof![1i64..30, 30i64..400, Just(100_000)],
            linear in any::<bool>(),
            now in prop_oneof![Just(i64::MAX - 1), 0i64..2500],
        ) {
            let mut windows = vec![from];
            for s in &steps {
                windows.push(windows[windows.len() - 1] + s);
            }
            let to = windows[windows.len() - 1];
            let weighting = if linear { Weighting::Linear } else { Weighting::Time };
            let mut bounds = vec![i64::MIN / 2];
            bounds.extend_from_slice(&windows);
            if linear {
                bounds.push(i64::MAX / 2);
            }
            let cells = cells(&xs, &bounds);
            let how = Limit { weighting, staleness, now };
            let got = first_stage(&cells, &windows, how);
            prop_assert_eq!(got.len(), steps.len());
            // Time after now holds nothing, unless readings were sent for it.
            let sent_ahead = xs.iter().any(|x| x.t >= now && x.t >= from && x.t < to);
            for (k, (window, agg)) in got.into_iter().enumerate() {
                let (a, b) = (windows[k], windows[k + 1]);
                let w = match window {
                    Window::Done(w) => w,
                    Window::Finer(mut p) => {
                        prop_assert_eq!(p.window, k);
                        cells[k + 1].samples.iter().for_each(|&x| p.fold.push_sample(x));
                        p.fold.finish(p.after)
                    }
                };
                let end = if sent_ahead { b } else { b.min(now.saturating_add(1)).max(a) };
                let want = brute(&xs, linear, staleness, a, end);
                prop_assert_eq!(w.held, want.held, "window {}", k);
                prop_assert!(close(w.integral, want.integral), "window {}: {} against {}", k, w.integral, want.integral);
                prop_assert_eq!(agg, cells[k + 1].agg);
            }
        }
    }
}

//! A time-weighted average of one series over a range, from the coarsest
//! pieces that answer it exactly.
//!
//! A rollup slot or bucket keeps its run's time integrals with every gap
//! counted ([`crate::domain::Integrals`]), so a piece whose longest gap is
//! within the staleness limit is weighed whole. The range is read as one
//! piece, with the limit's span before it for the value carried in (and
//! after it for the reading a line runs to); where
//! that piece holds a longer gap, it is read again in hours, and an hour that
//! still holds one (a limit under an hour, or a slot stored before integrals
//! were kept) is read reading by reading.

use crate::batcher::driver::BatcherHandle;
use crate::domain::{Agg, Sample, TimeFold, Weighted, Weighting};
use crate::store::{BucketStore, StoreError};

use super::engine::{Cost, Question, Series, evaluate};
use super::{Grid, MAX_VALUES_SECONDS, Need};

const DAY: i64 = 86_400;

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

/// Each series' time-weighted figures over `[q.from, q.to)` (`q.need` is
/// ignored; time after now holds nothing yet), with its readings'
/// aggregates. The first stage reads every series at once; a series whose
/// range holds a gap over the limit goes on alone.
pub async fn time_weighted<S: BucketStore>(
    store: &S,
    batcher: &BatcherHandle,
    q: Question<'_>,
    series: &[Series<'_>],
    weighting: Weighting,
    staleness: i64,
    now: i64,
) -> Result<(Vec<(Weighted, Agg)>, Cost), WeightedError> {
    let mut cost = Cost::default();
    let (from, to) = (q.from, q.to);
    // A reading before the limit's span holds nothing in the range, and
    // one after it is joined to nothing: the spans are widened to whole
    // days, each a slot of a rollup. Only a line needs the reading after.
    let staleness = staleness.max(1);
    let lead = from.saturating_sub(staleness);
    let mut bounds = vec![lead.saturating_sub(lead.rem_euclid(DAY)), from, to];
    if weighting == Weighting::Linear {
        let tail = to.saturating_add(staleness);
        bounds.push(tail.saturating_add((DAY - tail.rem_euclid(DAY)) % DAY));
    }
    let whole = Question {
        from: bounds[0],
        to: bounds[bounds.len() - 1],
        need: Need::Summaries,
        cache: None,
        ..q
    };
    let mut out = vec![(Weighted::default(), Agg::default()); series.len()];
    let mut pending: Vec<(usize, TimeFold, Option<Sample>)> = Vec::new();
    let c = evaluate(
        store,
        batcher,
        whole,
        Grid::Bounds(bounds),
        series,
        |i, cells| {
            let carried = cells.first().and_then(|c| c.summary).map(|s| s.last);
            // Where a line runs past the range's end.
            let after = cells.get(2).and_then(|c| c.summary).map(|s| s.first);
            let range = cells.get(1).and_then(|c| c.summary);
            out[i].1 = cells.get(1).map(|c| c.agg).unwrap_or_default();
            // Time after now holds nothing yet, unless readings were sent for it.
            let end = match range {
                Some(r) if r.last.t >= now => to,
                _ => to.min(now.saturating_add(1)).max(from),
            };
            let mut fold = TimeFold::new(weighting, staleness, from, end, carried);
            match range.map(|r| fold.push(&r)) {
                Some(Err(_)) => pending.push((i, fold, after)),
                _ => out[i].0 = fold.finish(after),
            }
        },
    )
    .await?;
    add(&mut cost, c);
    for (i, fold, after) in pending {
        let (w, c) = finer(store, batcher, q, series[i], fold, after).await?;
        add(&mut cost, c);
        out[i].0 = w;
    }
    Ok((out, cost))
}

/// One series' range again, in hours: each is weighed whole where it can
/// be, and reading by reading where not.
async fn finer<S: BucketStore>(
    store: &S,
    batcher: &BatcherHandle,
    q: Question<'_>,
    one: Series<'_>,
    mut fold: TimeFold,
    after: Option<Sample>,
) -> Result<(Weighted, Cost), WeightedError> {
    let series = [one];
    let mut cost = Cost::default();
    let (from, to) = (q.from, q.to);
    // In hours: each is weighed whole where it can be.
    let hours = Grid::aligned(from, to, 3600);
    let mut bounds: Vec<i64> = (0..=hours.points())
        .filter_map(|i| hours.start(i))
        .map(|s| s.clamp(from, to))
        .collect();
    bounds.dedup();
    let hourly = Question {
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
    let finer: Vec<usize> = (0..cells.len())
        .filter(|&i| cells[i].summary.is_some_and(|s| !fold.takes(&s)))
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
    let mut next = 0;
    for (i, cell) in cells.iter().enumerate() {
        let Some(s) = &cell.summary else { continue };
        if finer.binary_search(&i).is_err() && fold.push(s).is_ok() {
            continue;
        }
        // The hour's readings, in order.
        let (a, b) = (bounds[i], bounds[i + 1]);
        while let Some(&x) = readings.get(next).filter(|x| x.t < b) {
            if x.t >= a {
                fold.push_sample(x);
            }
            next += 1;
        }
    }
    Ok((fold.finish(after), cost))
}

fn add(cost: &mut Cost, c: Cost) {
    cost.documents += c.documents;
    cost.round_trips += c.round_trips;
}

//! Runs a [`Plan`] for a set of sensors folded into groups: every planned
//! read of every sensor streamed into its group's points, with the readings
//! acknowledged but not yet stored laid over their buckets.

use std::time::Duration;

use futures_util::TryStreamExt;
use futures_util::stream::FuturesUnordered;

use super::plan::Role;
use super::{Grid, Plan};
use crate::batcher::driver::BatcherHandle;
use crate::domain::{Agg, BucketRead, Granularity};
use crate::store::{BucketStore, Fetch, StoreError};

/// One sensor of a query and the group it adds to.
#[derive(Debug, Clone, Copy)]
pub struct Series<'a> {
    pub sensor: &'a str,
    pub group: usize,
}

/// Points per group, and what it cost.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub points: Vec<Vec<Agg>>,
    pub documents: u64,
}

/// A sensor's buckets with readings not yet stored: `(start, values)`.
type Unstored = Vec<(i64, Vec<(u16, f64)>)>;

/// Sensors read at once within one query.
const SENSORS_IN_PARALLEL: usize = 4;

/// What one query asks: a metric over `[from, to)` (stored seconds) on `grid`.
#[derive(Debug, Clone, Copy)]
pub struct Question<'a> {
    pub metric: &'a str,
    pub from: i64,
    pub to: i64,
    pub granularity: Granularity,
    pub max_time: Duration,
}

pub async fn evaluate<S: BucketStore>(
    store: &S,
    batcher: &BatcherHandle,
    q: Question<'_>,
    grid: Grid,
    series: &[Series<'_>],
    groups: usize,
) -> Result<Evaluation, StoreError> {
    // Memory first: a bucket written between the two looks is then in both,
    // never in neither.
    let unstored: Vec<Unstored> = series
        .iter()
        .map(|s| batcher.unstored_values(s.sensor, q.metric, q.from, q.to))
        .collect();
    let dirty: Vec<i64> = unstored
        .iter()
        .flat_map(|u| u.iter().map(|(start, _)| *start))
        .collect();
    let plan = Plan::new(q.granularity, q.from, q.to, grid, &dirty);
    let reads = plan.reads();
    let points = plan.grid().points();
    let mut out = Evaluation {
        points: vec![vec![Agg::default(); points]; groups],
        documents: 0,
    };
    let mut inputs = series.iter().zip(unstored);
    let mut running = FuturesUnordered::new();
    loop {
        while running.len() < SENSORS_IN_PARALLEL {
            let Some((s, unstored)) = inputs.next() else {
                break;
            };
            running.push(one_sensor(
                store, q, &plan, &reads, s.sensor, s.group, unstored,
            ));
        }
        let Some((group, agg, documents)) = running.try_next().await? else {
            break;
        };
        out.documents += documents;
        for (into, a) in out.points[group].iter_mut().zip(&agg) {
            into.merge(a);
        }
    }
    Ok(out)
}

async fn one_sensor<S: BucketStore>(
    store: &S,
    q: Question<'_>,
    plan: &Plan,
    reads: &[super::plan::PlannedRead],
    sensor: &str,
    group: usize,
    unstored: Unstored,
) -> Result<(usize, Vec<Agg>, u64), StoreError> {
    let mut points = vec![Agg::default(); plan.grid().points()];
    let mut documents = 0;
    let mut overlays: Vec<BucketRead> = Vec::new();
    for r in reads {
        let fetch = Fetch {
            sensor,
            metric: q.metric,
            level: r.level,
            starts: r.starts.clone(),
            slots: r.slots,
            values: r.values.clone(),
            max_time: q.max_time,
        };
        documents += match r.role {
            Role::Overlay => store.fetch(fetch, |b| overlays.push(b)).await?,
            role => {
                store
                    .fetch(fetch, |b| plan.fold(r.tier, role, &b, &mut points))
                    .await?
            }
        };
    }
    // Buckets the plan overlays: as stored (if at all) with this sensor's
    // unstored readings over them.
    for &start in plan.overlay_starts() {
        let stored = overlays.iter().find(|b| b.start == start);
        let newer = unstored
            .iter()
            .find(|(s, _)| *s == start)
            .map(|(_, v)| v.as_slice())
            .unwrap_or_default();
        let values = overlay(stored, newer);
        plan.fold_values(start, &values, &mut points);
    }
    Ok((group, points, documents))
}

/// A bucket's values as stored with the unstored ones laid over them (they
/// are newer: they win per second).
fn overlay(stored: Option<&BucketRead>, newer: &[(u16, f64)]) -> Vec<(u16, f64)> {
    let mut values: Vec<(u16, f64)> = stored.map(|b| b.values.clone()).unwrap_or_default();
    values.retain(|(o, _)| newer.binary_search_by_key(o, |&(n, _)| n).is_err());
    values.extend_from_slice(newer);
    values.sort_by_key(|&(o, _)| o);
    values
}

/// The newest reading of a series: the newest stored one, or a newer one
/// not yet stored.
pub async fn latest<S: BucketStore>(
    store: &S,
    batcher: &BatcherHandle,
    sensor: &str,
    metric: &str,
    max_time: Duration,
) -> Result<Option<(i64, f64)>, StoreError> {
    let stored = store.latest(sensor, metric, max_time).await?;
    let from = stored.map_or(i64::MIN / 2, |(ts, _)| ts);
    let unstored = batcher
        .unstored_values(sensor, metric, from, i64::MAX / 2)
        .into_iter()
        .flat_map(|(start, values)| {
            values
                .into_iter()
                .map(move |(o, v)| (start + i64::from(o), v))
        })
        .max_by_key(|&(ts, _)| ts);
    Ok(match (stored, unstored) {
        (Some(s), Some(u)) if u.0 >= s.0 => Some(u),
        (Some(s), _) => Some(s),
        (None, u) => u,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unstored_values_win_per_second() {
        let stored = BucketRead {
            values: vec![(1, 1.0), (2, 2.0), (5, 5.0)],
            ..BucketRead::default()
        };
        assert_eq!(
            overlay(Some(&stored), &[(2, 20.0), (3, 30.0)]),
            vec![(1, 1.0), (2, 20.0), (3, 30.0), (5, 5.0)]
        );
        assert_eq!(overlay(None, &[(3, 30.0)]), vec![(3, 30.0)]);
    }
}

//! PromQL, the subset dashboards use, answered from the buckets with
//! Prometheus' semantics, so Grafana's Prometheus data source works unchanged.
//!
//! - [`compile`]: the parsed expression checked and turned into a tree over
//!   data leaves (pure).
//! - [`window`]: each step's window `(t − range, t]` as cells of stored
//!   seconds; the planner answers cells from levels, windows merge cells (pure).
//! - [`value`]: aggregations and arithmetic over all steps at once (pure).
//! - this module: finds each leaf's series in the registry and reads its cells.

pub mod compile;
pub mod value;
pub mod window;

use std::time::Duration;

use promql_parser::label::Matcher;

pub use compile::{Func, Leaf, compile};
pub use value::{LabelSet, NAME, Series, Value, format_value};
pub use window::{Steps, Windows};

use super::engine::{self, Question};
use super::{Grid, Series as Member};
use crate::batcher::driver::BatcherHandle;
use crate::domain::{Agg, Granularity, Level, Starts, Values};
use crate::store::{BucketStore, Fetch, SensorInfo, SensorQuery, StoreError};

/// Prometheus' error classes.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PromError {
    #[error("{0}")]
    BadData(String),
    #[error("{0}")]
    Execution(String),
    /// Reading the documents failed; the caller decides what to tell.
    #[error(transparent)]
    Storage(#[from] StoreError),
}

/// What a query may touch and take.
pub struct Context<'a, S> {
    pub store: &'a S,
    pub batcher: &'a BatcherHandle,
    pub granularity: Granularity,
    pub max_series: usize,
    /// How far back from its first step a query may read (`query.max_range`).
    pub max_range_ms: i64,
    pub max_time: Duration,
    /// Whether the caller may read this sensor (a device token's patterns).
    pub may_access: &'a (dyn Fn(&str) -> bool + Sync),
}

pub struct Outcome {
    pub value: Value,
    pub documents: u64,
}

/// One series a selector found.
#[derive(Debug, Clone)]
pub struct Found {
    pub sensor: String,
    pub metric: String,
    pub labels: LabelSet,
}

/// A series' labels: the sensor's, its id as `sensor`, the metric as `__name__`.
pub fn labels_of(info: &SensorInfo, metric: &str) -> LabelSet {
    let mut l: LabelSet = info
        .labels
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    l.insert(NAME.into(), metric.into());
    l.insert("sensor".into(), info.sensor.clone());
    l
}

/// Whether a series' labels pass every matcher (a missing label is "").
pub fn matches(matchers: &[Matcher], labels: &LabelSet) -> bool {
    matchers
        .iter()
        .all(|m| m.is_match(labels.get(&m.name).map_or("", String::as_str)))
}

/// The series `matchers` select, found through the registry with the
/// equality matchers pushed down: at most `max + 1`, so the caller can tell
/// when there are more than `max`.
pub async fn select<S: BucketStore>(
    store: &S,
    matchers: &[Matcher],
    max: usize,
    may_access: &(dyn Fn(&str) -> bool + Sync),
) -> Result<Vec<Found>, PromError> {
    use promql_parser::label::MatchOp;
    let equal = |name: &str| {
        matchers
            .iter()
            .find(|m| m.name == name && m.op == MatchOp::Equal)
            .map(|m| m.value.as_str())
    };
    let labels: Vec<(String, String)> = matchers
        .iter()
        .filter(|m| m.op == MatchOp::Equal && !m.value.is_empty())
        .filter(|m| m.name != NAME && m.name != "sensor")
        .map(|m| (m.name.clone(), m.value.clone()))
        .collect();
    let query = SensorQuery {
        after: None,
        prefix: equal("sensor").unwrap_or(""),
        labels: &labels,
        metric: equal(NAME).filter(|m| !m.is_empty()),
    };
    let mut found = Vec::new();
    store
        .sensors(query, max.saturating_add(1), |info| {
            if found.len() > max {
                // Over the limit: keeping it ends the scan.
                return true;
            }
            if !may_access(&info.sensor) {
                return false;
            }
            let before = found.len();
            for metric in &info.metrics {
                let labels = labels_of(info, metric);
                if matches(matchers, &labels) {
                    found.push(Found {
                        sensor: info.sensor.clone(),
                        metric: metric.clone(),
                        labels,
                    });
                }
            }
            found.len() > before
        })
        .await?;
    found.truncate(max.saturating_add(1));
    Ok(found)
}

/// Evaluates `query` at every step.
pub async fn evaluate<S: BucketStore>(
    ctx: &Context<'_, S>,
    query: &str,
    steps: Steps,
) -> Result<Outcome, PromError> {
    let (node, leaves) = compile(query)?;
    let span = steps
        .at(steps.n.saturating_sub(1))
        .saturating_sub(steps.start_ms);
    for leaf in &leaves {
        let reach = span
            .saturating_add(leaf.range_ms)
            .saturating_add(leaf.offset_ms.saturating_abs());
        if reach > ctx.max_range_ms {
            return Err(PromError::BadData(format!(
                "the query reaches further than query.max_range ({} s) with its range and offset",
                ctx.max_range_ms / 1000
            )));
        }
    }
    let mut documents = 0;
    let mut selected = 0;
    let mut data = Vec::with_capacity(leaves.len());
    for leaf in &leaves {
        let left = ctx.max_series.saturating_sub(selected);
        let found = select(ctx.store, &leaf.matchers, left, ctx.may_access).await?;
        selected += found.len();
        if selected > ctx.max_series {
            return Err(PromError::BadData(format!(
                "the query selects more than {} series (query.max_series); narrow its label matchers",
                ctx.max_series
            )));
        }
        let (series, docs) = read_leaf(ctx, leaf, &found, &steps).await?;
        documents += docs;
        data.push(series);
    }
    let value = value::run(&node, &mut data, steps.n)?;
    Ok(Outcome { value, documents })
}

/// Every found series' value at every step.
async fn read_leaf<S: BucketStore>(
    ctx: &Context<'_, S>,
    leaf: &Leaf,
    found: &[Found],
    steps: &Steps,
) -> Result<(Vec<Series>, u64), PromError> {
    let windows = Windows::new(steps, leaf.range_ms, leaf.offset_ms);
    let labels = |f: &Found| {
        let mut l = f.labels.clone();
        if !leaf.keep_name {
            l.remove(NAME);
        }
        l
    };
    let Some((from, to)) = windows.range() else {
        let empty = found
            .iter()
            .map(|f| Series {
                labels: labels(f),
                values: vec![None; steps.n],
            })
            .collect();
        return Ok((empty, 0));
    };
    let grid = Grid::Bounds(windows.bounds.clone());
    let mut out = Vec::with_capacity(found.len());
    let mut documents = 0;
    if leaf.func == Func::Last {
        for f in found {
            let q = question(ctx, &f.metric, from, to);
            let (cells, docs) =
                newest_per_cell(ctx.store, ctx.batcher, q, &grid, &f.sensor, &windows).await?;
            documents += docs;
            let values = windows
                .last(&cells)
                .into_iter()
                .map(|x| x.map(|(_, v)| v))
                .collect();
            out.push(Series {
                labels: labels(f),
                values,
            });
        }
        return Ok((out, documents));
    }
    // One evaluation per metric: every sensor its own group.
    let mut metrics: Vec<&str> = found.iter().map(|f| f.metric.as_str()).collect();
    metrics.sort_unstable();
    metrics.dedup();
    for metric in metrics {
        let of: Vec<&Found> = found.iter().filter(|f| f.metric == metric).collect();
        let members: Vec<Member<'_>> = of
            .iter()
            .enumerate()
            .map(|(group, f)| Member {
                sensor: &f.sensor,
                group,
            })
            .collect();
        let q = question(ctx, metric, from, to);
        let e = engine::evaluate(
            ctx.store,
            ctx.batcher,
            q,
            grid.clone(),
            &members,
            members.len(),
        )
        .await?;
        documents += e.documents;
        for (f, cells) in of.iter().zip(&e.points) {
            let values = windows
                .fold(cells)
                .iter()
                .map(|a| window_value(leaf.func, a))
                .collect();
            out.push(Series {
                labels: labels(f),
                values,
            });
        }
    }
    Ok((out, documents))
}

/// Bucket starts listed rather than read as one range above this many.
const MAX_LISTED_STARTS: usize = 10_000;

/// The newest reading in each cell of `windows` (stored, or not yet: those
/// win per second), for `last_over_time` and bare selectors. Reads only the
/// buckets the windows touch, as a list when they are sparse.
async fn newest_per_cell<S: BucketStore>(
    store: &S,
    batcher: &BatcherHandle,
    q: Question<'_>,
    grid: &Grid,
    sensor: &str,
    windows: &Windows,
) -> Result<(Vec<Option<(i64, f64)>>, u64), StoreError> {
    let len = q.granularity.seconds();
    let mut cells: Vec<Option<(i64, f64)>> = vec![None; grid.points()];
    let mut keep = |ts: i64, v: f64| {
        if ts >= q.from
            && ts < q.to
            && let Some(p) = grid.point(ts)
            && cells[p].is_none_or(|(t, _)| t <= ts)
        {
            cells[p] = Some((ts, v));
        }
    };
    let unstored = batcher.unstored_values(sensor, q.metric, q.from, q.to);
    // The buckets the windows touch (windows come sorted by start).
    let mut starts: Vec<i64> = Vec::new();
    for &(a, b) in &windows.spans {
        if a >= b {
            continue;
        }
        let (from, to) = (windows.bounds[a], windows.bounds[b]);
        let mut s = from - from.rem_euclid(len);
        if let Some(&last) = starts.last() {
            s = s.max(last + len);
        }
        while s < to && starts.len() <= MAX_LISTED_STARTS {
            starts.push(s);
            s += len;
        }
    }
    let first = q.from - q.from.rem_euclid(len);
    let all = (q.to - first + len - 1) / len;
    let which = if starts.len() > MAX_LISTED_STARTS || starts.len() as i64 * 2 > all {
        Starts::Range(first, q.to)
    } else {
        Starts::Only(starts)
    };
    let fetch = Fetch {
        sensor,
        metric: q.metric,
        level: Level::Buckets,
        starts: which,
        slots: false,
        values: Values::All,
        max_time: q.max_time,
    };
    let documents = store
        .fetch(fetch, |b| {
            let newer = unstored
                .iter()
                .find(|(s, _)| *s == b.start)
                .map(|(_, v)| v.as_slice())
                .unwrap_or_default();
            for &(o, v) in &b.values {
                if newer.binary_search_by_key(&o, |&(n, _)| n).is_err() {
                    keep(b.start + i64::from(o), v);
                }
            }
        })
        .await?;
    for (start, values) in &unstored {
        for &(o, v) in values {
            keep(start + i64::from(o), v);
        }
    }
    Ok((cells, documents))
}

fn question<'a, S>(ctx: &Context<'_, S>, metric: &'a str, from: i64, to: i64) -> Question<'a> {
    Question {
        metric,
        from,
        to,
        granularity: ctx.granularity,
        max_time: ctx.max_time,
    }
}

fn window_value(func: Func, a: &Agg) -> Option<f64> {
    if a.count == 0 {
        return None;
    }
    Some(match func {
        Func::Avg => a.sum / a.count as f64,
        Func::Sum => a.sum,
        Func::Min => a.min,
        Func::Max => a.max,
        Func::Count => a.count as f64,
        Func::Last => return None,
    })
}

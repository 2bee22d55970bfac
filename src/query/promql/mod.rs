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

use super::engine::{self, Cost, Question};
use super::plan::Need;
use super::{Grid, Series as Member};
use crate::batcher::driver::BatcherHandle;
use crate::domain::{Agg, Granularity, Summary};
use crate::store::{BucketStore, SensorInfo, SensorQuery, StoreError};

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
    pub cost: Cost,
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
    let mut cost = Cost::default();
    let mut selected = 0;
    let mut data = Vec::with_capacity(leaves.len());
    for leaf in &leaves {
        let left = ctx.max_series.saturating_sub(selected);
        let found = select(ctx.store, &leaf.matchers, left, ctx.may_access).await?;
        // The registry's find (its documents are not the data's).
        cost.round_trips += 1;
        selected += found.len();
        if selected > ctx.max_series {
            return Err(PromError::BadData(format!(
                "the query selects more than {} series (query.max_series); narrow its label matchers",
                ctx.max_series
            )));
        }
        let (series, c) = read_leaf(ctx, leaf, &found, &steps).await?;
        cost.documents += c.documents;
        cost.round_trips += c.round_trips;
        data.push(series);
    }
    let value = value::run(&node, &mut data, steps.n)?;
    Ok(Outcome { value, cost })
}

/// Every found series' value at every step: each metric's series read
/// through the one engine, a level per round trip, each window the merge of
/// its cells' summaries.
async fn read_leaf<S: BucketStore>(
    ctx: &Context<'_, S>,
    leaf: &Leaf,
    found: &[Found],
    steps: &Steps,
) -> Result<(Vec<Series>, Cost), PromError> {
    let windows = Windows::new(steps, leaf.range_ms, leaf.offset_ms);
    let labels = |f: &Found| {
        let mut l = f.labels.clone();
        if !leaf.keep_name {
            l.remove(NAME);
        }
        l
    };
    let mut out: Vec<Series> = found
        .iter()
        .map(|f| Series {
            labels: labels(f),
            values: vec![None; steps.n],
        })
        .collect();
    let mut cost = Cost::default();
    let Some((from, to)) = windows.range() else {
        return Ok((out, cost));
    };
    let grid = Grid::Bounds(windows.bounds.clone());
    let mut metrics: Vec<&str> = found.iter().map(|f| f.metric.as_str()).collect();
    metrics.sort_unstable();
    metrics.dedup();
    for metric in metrics {
        let of: Vec<usize> = (0..found.len())
            .filter(|&i| found[i].metric == metric)
            .collect();
        let members: Vec<Member<'_>> = of
            .iter()
            .map(|&i| Member {
                sensor: &found[i].sensor,
            })
            .collect();
        let q = Question {
            metric,
            from,
            to,
            granularity: ctx.granularity,
            need: match leaf.func {
                Func::Last => Need::Summaries,
                _ => Need::Aggregates,
            },
            max_time: ctx.max_time,
        };
        let c = engine::evaluate(
            ctx.store,
            ctx.batcher,
            q,
            grid.clone(),
            &members,
            |k, cells| {
                out[of[k]].values = match q.need {
                    Need::Summaries => {
                        let summaries: Vec<Option<Summary>> =
                            cells.iter().map(|c| c.summary).collect();
                        windows
                            .fold(&summaries)
                            .iter()
                            .map(|w| w.as_ref().map(|s| s.last.v))
                            .collect()
                    }
                    Need::Aggregates => {
                        let aggs: Vec<Agg> = cells.iter().map(|c| c.agg).collect();
                        windows
                            .fold_aggs(&aggs)
                            .iter()
                            .map(|a| window_value(leaf.func, a))
                            .collect()
                    }
                };
            },
        )
        .await?;
        cost.documents += c.documents;
        cost.round_trips += c.round_trips;
    }
    Ok((out, cost))
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
        // Read with summaries, above.
        Func::Last => return None,
    })
}

//! A query's reads: each selector's series found in the registry, their
//! cells read through the engine, and the tree evaluated over them.

use std::sync::Arc;
use std::time::Duration;

use promql_parser::label::Matcher;

use super::ast::{Func, Node, RangeFunc};
use super::budget::{self, Ledger, MemoryPool};
use super::compile::compile;
use super::error::PromError;
use super::eval::{self, Leaf, LeafFunc};
use super::functions;
use super::functions::{Window, range_value};
use super::limits::Limits;
use super::value::{LabelSet, NAME, Series, Value};
use super::window::{Steps, Windows};
use crate::batcher::driver::BatcherHandle;
use crate::domain::{Agg, Granularity, Sample, Sketch, Summary};
use crate::query::engine::{self, Cost, Question};
use crate::query::plan::{Cell, Need};
use crate::query::{Grid, Series as Member};
use crate::store::{MongoStore, SensorInfo, SensorQuery};

/// What a query may touch and take.
pub struct Context<'a> {
    pub store: &'a MongoStore,
    pub batcher: &'a BatcherHandle,
    pub granularity: Granularity,
    pub max_series: usize,
    /// How far back from its first step a query may read (`query.max_range`).
    pub max_range_ms: i64,
    pub max_time: Duration,
    /// Whether the caller may read this sensor (a device token's patterns).
    pub may_access: &'a (dyn Fn(&str) -> bool + Sync),
    /// What the query's text may be.
    pub limits: Limits,
    /// Values the query may hold: series × evaluation times, summed over
    /// its reads (`query.max_samples`).
    pub max_samples: usize,
    /// Bytes the query may hold at once (`query.max_memory_per_query`),
    /// drawn from what all queries may hold (`query.max_memory`).
    pub max_memory: usize,
    pub pool: Option<Arc<MemoryPool>>,
    /// The results cache of closed periods, if the query may use it.
    pub cache: Option<crate::query::CacheUse<'a>>,
    /// `quantile_over_time` windows past 31 days answer from the rollups'
    /// percentile sketches (asked for explicitly: within
    /// `buckets.sketch_accuracy`, not exact); shorter ones stay exact.
    pub sketch_quantiles: bool,
}

#[derive(Debug)]
pub struct Outcome {
    pub value: Value,
    pub cost: Cost,
    /// `sort`/`sort_desc` at the top: an instant answer in value order
    /// (ascending or not).
    pub sorted: Option<bool>,
    /// The earliest time any of its reads reaches back to (epoch ms; from
    /// the parsed query: steps, ranges, lookbacks and offsets), if it reads.
    pub earliest_ms: Option<i64>,
    /// The query's memory: the answer and what writing it out takes stay
    /// charged (to the query and the instance) until this is dropped.
    pub memory: Arc<Ledger>,
}

/// One series a selector found.
#[derive(Debug, Clone)]
pub struct Found {
    pub sensor: String,
    pub metric: String,
    pub labels: LabelSet,
    /// What the listing vouches for (see [`crate::store::Quiet`]).
    pub quiet: Option<crate::store::Quiet>,
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
pub async fn select(
    store: &MongoStore,
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
        through: None,
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
                        quiet: info.quiet(),
                    });
                }
            }
            found.len() > before
        })
        .await?;
    found.truncate(max.saturating_add(1));
    Ok(found)
}

/// How far a quantile's windows may reach: it holds every reading of them.
const MAX_VALUES_RANGE_MS: i64 = crate::query::MAX_VALUES_SECONDS * 1000;

/// A compiled query ready to read: its tree, evaluation times and reads,
/// and the budgets its reads are counted against. The store's evaluation
/// and the in-memory one ([`super::memory`]) share it.
pub(super) struct Prepared {
    node: Node,
    q: eval::Query,
    pub(super) leaves: Vec<Leaf>,
    earliest_ms: Option<i64>,
    max_series: usize,
    max_samples: usize,
    selected: usize,
    samples: usize,
}

impl Prepared {
    /// Compiles `query` within `limits` and lists its reads, each checked
    /// against `max_range_ms`.
    pub(super) fn new(
        query: &str,
        steps: Steps,
        limits: &Limits,
        budget: (usize, usize, i64),
        (deadline, sketches, ledger): (Option<std::time::Instant>, bool, Arc<Ledger>),
    ) -> Result<Self, PromError> {
        let (max_series, max_samples, max_range_ms) = budget;
        let node = compile(query, limits)?;
        let q = eval::Query {
            steps,
            max_steps: max_samples,
            deadline,
            max_label_bytes: limits.max_label_bytes,
            ledger,
        };
        let leaves = eval::leaves(&node, &q, &steps)?;
        for leaf in &leaves {
            check_reach(leaf, max_range_ms, sketches)?;
        }
        let earliest_ms = leaves
            .iter()
            .map(|l| {
                l.steps
                    .start_ms
                    .saturating_sub(l.range_ms)
                    .saturating_sub(l.selector.offset_ms)
            })
            .min();
        Ok(Self {
            node,
            q,
            leaves,
            earliest_ms,
            max_series,
            max_samples,
            selected: 0,
            samples: 0,
        })
    }

    /// What the query holds.
    pub(super) fn ledger(&self) -> &Ledger {
        &self.q.ledger
    }

    /// How many more series the query may select.
    pub(super) fn series_left(&self) -> usize {
        self.max_series.saturating_sub(self.selected)
    }

    /// Counts a read of `found` series at `steps` evaluation times; an
    /// error if the query selects or would hold too much.
    pub(super) fn count(&mut self, found: usize, steps: usize) -> Result<(), PromError> {
        self.selected += found;
        if self.selected > self.max_series {
            return Err(PromError::BadData(format!(
                "the query selects more than {} series (query.max_series); narrow its label matchers",
                self.max_series
            )));
        }
        // A read without series still lays out its windows.
        self.samples = self
            .samples
            .saturating_add(found.max(1).saturating_mul(steps));
        if self.samples > self.max_samples {
            return Err(PromError::BadData(format!(
                "the query would hold more than {} values (query.max_samples): series times evaluation times; narrow its selectors, range or subquery steps",
                self.max_samples
            )));
        }
        Ok(())
    }

    /// Evaluates the tree over its reads, in the order of its leaves.
    pub(super) fn finish(self, reads: Vec<Vec<Series>>, cost: Cost) -> Result<Outcome, PromError> {
        let steps = self.q.steps;
        let value = eval::run(&self.node, &self.q, &steps, &mut reads.into_iter())?;
        let sorted = match &self.node {
            Node::Call {
                func: Func::Sort, ..
            } => Some(true),
            Node::Call {
                func: Func::SortDesc,
                ..
            } => Some(false),
            _ => None,
        };
        if let Value::String(_) = value {
            return Err(PromError::BadData(
                "a string is an argument (of label_replace, label_join, count_values), not an answer, in Hourglass".into(),
            ));
        }
        // Writing the answer out copies its points and builds its text:
        // charged before either is built, held until the answer is sent.
        self.q.ledger.reserve(budget::answer_bytes(&value))?;
        Ok(Outcome {
            value,
            cost,
            sorted,
            earliest_ms: self.earliest_ms,
            memory: self.q.ledger.clone(),
        })
    }
}

/// Whether a read stays within `query.max_range` (and a quantile's within
/// what may be held, unless answered from `sketches`).
fn check_reach(leaf: &Leaf, max_range_ms: i64, sketches: bool) -> Result<(), PromError> {
    let span = leaf
        .steps
        .at(leaf.steps.n.saturating_sub(1))
        .saturating_sub(leaf.steps.start_ms);
    let reach = span
        .saturating_add(leaf.range_ms)
        .saturating_add(leaf.selector.offset_ms.saturating_abs());
    if reach > max_range_ms {
        return Err(PromError::BadData(format!(
            "the query reaches further than query.max_range ({} s) with its range and offset",
            max_range_ms / 1000
        )));
    }
    if !sketches && from_sketches(leaf) {
        return Err(PromError::BadData(
            "quantile_over_time reads every reading of its windows: in Hourglass they may span at most 31 days (add quantile_sketches=true to the request to answer longer ones from the rollups' percentile sketches, within buckets.sketch_accuracy)".into(),
        ));
    }
    Ok(())
}

/// Whether a quantile's windows reach past what may be held: with
/// `quantile_sketches=true` they are answered from sketches.
fn from_sketches(leaf: &Leaf) -> bool {
    let span = leaf
        .steps
        .at(leaf.steps.n.saturating_sub(1))
        .saturating_sub(leaf.steps.start_ms);
    leaf.func == LeafFunc::Range(RangeFunc::Quantile)
        && span.saturating_add(leaf.range_ms) > MAX_VALUES_RANGE_MS
}

/// Runs CPU-bound work (parsing, compiling regexes, evaluating) on the
/// blocking pool, so no async worker is held by it; each step checks the
/// query's deadline.
async fn off_the_workers<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, PromError> + Send + 'static,
) -> Result<T, PromError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| PromError::Execution("the query's evaluation failed".into()))?
}

/// Evaluates `query` at every step.
pub async fn evaluate(ctx: &Context<'_>, query: &str, steps: Steps) -> Result<Outcome, PromError> {
    let ledger = Arc::new(Ledger::new(ctx.max_memory, ctx.pool.clone()));
    let (text, limits, sketches) = (query.to_owned(), ctx.limits, ctx.sketch_quantiles);
    let budget = (ctx.max_series, ctx.max_samples, ctx.max_range_ms);
    let deadline = std::time::Instant::now().checked_add(ctx.max_time);
    let mut prepared = off_the_workers(move || {
        Prepared::new(&text, steps, &limits, budget, (deadline, sketches, ledger))
    })
    .await?;
    let mut cost = Cost::default();
    let mut reads = Vec::with_capacity(prepared.leaves.len());
    let leaves = std::mem::take(&mut prepared.leaves);
    for leaf in &leaves {
        let left = prepared.series_left();
        let found = select(ctx.store, &leaf.selector.matchers, left, ctx.may_access).await?;
        // The registry's find (its documents are not the data's).
        cost.round_trips += 1;
        prepared.count(found.len(), leaf.steps.n)?;
        let (series, c) = read_leaf(ctx, leaf, &found, prepared.ledger()).await?;
        cost.documents += c.documents;
        cost.round_trips += c.round_trips;
        reads.push(series);
    }
    off_the_workers(move || prepared.finish(reads, cost)).await
}

/// Every found series' value at every evaluation time of the read: each
/// metric's series read through the one engine, a level per round trip,
/// each window the merge of its cells.
async fn read_leaf(
    ctx: &Context<'_>,
    leaf: &Leaf,
    found: &[Found],
    ledger: &Ledger,
) -> Result<(Vec<Series>, Cost), PromError> {
    let steps = &leaf.steps;
    ledger.reserve_read(
        found
            .iter()
            .map(|f| budget::series_bytes(&f.labels, steps.n))
            .fold(0usize, usize::saturating_add),
    )?;
    let offset = leaf.selector.offset_ms;
    let windows = Windows::new(steps, leaf.range_ms, offset);
    let labels = |f: &Found| {
        let mut l = f.labels.clone();
        if !leaf.keeps_name() {
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
    let need = match leaf.func {
        LeafFunc::Instant | LeafFunc::Timestamp => Need::Summaries,
        _ if ctx.sketch_quantiles && from_sketches(leaf) => Need::Sketches,
        LeafFunc::Range(f) => f.need(),
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
                quiet: found[i].quiet,
            })
            .collect();
        let q = Question {
            metric,
            from,
            to,
            granularity: ctx.granularity,
            need,
            max_time: ctx.max_time,
            cache: ctx.cache,
        };
        let c = engine::evaluate(
            ctx.store,
            ctx.batcher,
            q,
            grid.clone(),
            &members,
            |k, cells| {
                out[of[k]].values = window_values(leaf, &windows, need, &cells);
            },
        )
        .await?;
        cost.documents += c.documents;
        cost.round_trips += c.round_trips;
    }
    Ok((out, cost))
}

/// A series' value at each evaluation time, from its cells.
pub(super) fn window_values(
    leaf: &Leaf,
    windows: &Windows,
    need: Need,
    cells: &[Cell],
) -> Vec<Option<f64>> {
    // Long: one arm per range function, each from the window's merged cells.
    let steps = &leaf.steps;
    let window = |k: usize, agg: &Agg, summary: Option<&Summary>, samples: &[Sample]| {
        let end = steps.at(k).saturating_sub(leaf.selector.offset_ms);
        let w = Window {
            start_ms: end.saturating_sub(leaf.range_ms),
            end_ms: end,
            range_ms: leaf.range_ms,
            agg,
            summary,
            samples,
        };
        match leaf.func {
            LeafFunc::Instant => summary.map(|s| s.last.v),
            LeafFunc::Timestamp => summary.map(|s| s.last.t as f64),
            LeafFunc::Range(f) => {
                range_value(f, &w, leaf.param.get(k).copied().unwrap_or(f64::NAN))
            }
        }
    };
    match need {
        // Only quantiles past 31 days, asked for explicitly.
        Need::Sketches => windows
            .spans
            .iter()
            .enumerate()
            .map(|(k, &(a, b))| {
                let mut merged: Option<Sketch> = None;
                for c in cells[a..b.min(cells.len())].iter() {
                    match (&mut merged, &c.sketch) {
                        (Some(m), Some(x)) => {
                            // One accuracy, the store's: they merge.
                            let _ = m.merge(x);
                        }
                        (None, Some(x)) => merged = Some(x.clone()),
                        (_, None) => {}
                    }
                }
                let param = leaf.param.get(k).copied().unwrap_or(f64::NAN);
                functions::sketch_quantile(param, merged.as_ref()?)
            })
            .collect(),
        Need::Aggregates => {
            let aggs: Vec<Agg> = cells.iter().map(|c| c.agg).collect();
            windows
                .fold_aggs(&aggs)
                .iter()
                .enumerate()
                .map(|(k, a)| window(k, a, None, &[]))
                .collect()
        }
        Need::Summaries => {
            let summaries: Vec<Option<Summary>> = cells.iter().map(|c| c.summary).collect();
            windows
                .fold(&summaries)
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let agg = s.as_ref().map(Summary::agg).unwrap_or_default();
                    window(k, &agg, s.as_ref(), &[])
                })
                .collect()
        }
        Need::Values => {
            let mut samples: Vec<Sample> = Vec::new();
            windows
                .spans
                .iter()
                .enumerate()
                .map(|(k, &(a, b))| {
                    samples.clear();
                    for c in &cells[a..b.min(cells.len())] {
                        samples.extend_from_slice(&c.samples);
                    }
                    let summary = Summary::of(&samples);
                    let agg = summary.as_ref().map(Summary::agg).unwrap_or_default();
                    window(k, &agg, summary.as_ref(), &samples)
                })
                .collect()
        }
    }
}

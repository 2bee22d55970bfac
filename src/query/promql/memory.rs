//! PromQL over a few series held in memory: the whole path of a query
//! (limits, parse, compile, the reads' plan, their windows, evaluation)
//! without a store, for the fuzz target and the tests that prove deep
//! queries safe on a worker's stack. Pure.

use super::budget::{Ledger, series_bytes};
use super::error::PromError;
use super::eval::LeafFunc;
use super::limits::Limits;
use super::read::{Outcome, Prepared, matches, window_values};
use super::value::{LabelSet, NAME, Series};
use super::window::{Steps, Windows};
use crate::domain::{Agg, Sample, Summary};
use crate::query::engine::Cost;
use crate::query::plan::{Cell, Need};

/// Series and their readings (epoch seconds, in time order), with their
/// labels as a selector sees them (`__name__` and `sensor` among them).
#[derive(Debug, Clone, Default)]
pub struct Memory {
    pub series: Vec<(LabelSet, Vec<Sample>)>,
}

/// What an in-memory query may take (`[query]`'s limits).
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub limits: Limits,
    pub max_series: usize,
    pub max_samples: usize,
    pub max_range_ms: i64,
    /// Bytes it may hold at once (`query.max_memory_per_query`).
    pub max_memory: usize,
    /// When the evaluation gives up (`query.timeout`).
    pub deadline: Option<std::time::Instant>,
}

impl Memory {
    /// Evaluates `query` at `steps` over these series.
    pub fn evaluate(
        &self,
        query: &str,
        steps: Steps,
        budget: &Budget,
    ) -> Result<Outcome, PromError> {
        let mut prepared = Prepared::new(
            query,
            steps,
            &budget.limits,
            (budget.max_series, budget.max_samples, budget.max_range_ms),
            // Readings in memory: every quantile is exact.
            (
                budget.deadline,
                false,
                std::sync::Arc::new(Ledger::new(budget.max_memory, None)),
            ),
        )?;
        let leaves = std::mem::take(&mut prepared.leaves);
        let mut reads = Vec::with_capacity(leaves.len());
        for leaf in &leaves {
            let found: Vec<&(LabelSet, Vec<Sample>)> = self
                .series
                .iter()
                .filter(|(labels, _)| matches(&leaf.selector.matchers, labels))
                .take(prepared.series_left().saturating_add(1))
                .collect();
            prepared.count(found.len(), leaf.steps.n)?;
            prepared.ledger().reserve_read(
                found
                    .iter()
                    .map(|(labels, _)| series_bytes(labels, leaf.steps.n))
                    .fold(0usize, usize::saturating_add),
            )?;
            let windows = Windows::new(&leaf.steps, leaf.range_ms, leaf.selector.offset_ms);
            let need = match leaf.func {
                LeafFunc::Instant | LeafFunc::Timestamp => Need::Summaries,
                LeafFunc::Range(f) => f.need(),
            };
            let read = found
                .into_iter()
                .map(|(labels, samples)| {
                    let mut labels = labels.clone();
                    if !leaf.keeps_name() {
                        labels.remove(NAME);
                    }
                    let cells = cells(&windows.bounds, samples, need);
                    let values = if windows.range().is_some() {
                        window_values(leaf, &windows, need, &cells)
                    } else {
                        vec![None; leaf.steps.n]
                    };
                    Series { labels, values }
                })
                .collect();
            reads.push(read);
        }
        prepared.finish(reads, Cost::default())
    }
}

/// The cells between consecutive `bounds` (stored seconds) of `samples`.
fn cells(bounds: &[i64], samples: &[Sample], need: Need) -> Vec<Cell> {
    bounds
        .windows(2)
        .map(|w| {
            let from = samples.partition_point(|s| s.t < w[0]);
            let to = samples.partition_point(|s| s.t < w[1]);
            let inside = &samples[from..to.max(from)];
            let mut agg = Agg::default();
            for s in inside {
                agg.add(s.v);
            }
            Cell {
                agg,
                summary: Summary::of(inside),
                samples: if need == Need::Values {
                    inside.to_vec()
                } else {
                    Vec::new()
                },
                sketch: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::promql::Value;

    fn memory() -> Memory {
        let series = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, sensor)| {
                let labels: LabelSet = [
                    (NAME.to_string(), "temp".to_string()),
                    ("sensor".to_string(), (*sensor).to_string()),
                ]
                .into_iter()
                .collect();
                let samples = (0..600)
                    .map(|t| Sample {
                        t: t * 10,
                        v: (i as f64 + 1.0) * t as f64,
                    })
                    .collect();
                (labels, samples)
            })
            .collect();
        Memory { series }
    }

    fn budget() -> Budget {
        Budget {
            limits: Limits::default(),
            max_series: 10,
            max_samples: 100_000,
            max_range_ms: 86_400_000,
            max_memory: usize::MAX,
            deadline: None,
        }
    }

    #[test]
    fn a_fleet_sum_of_averages_is_what_the_readings_give() {
        let steps = Steps::new(3_000_000, 3_000_000, 1);
        let got = memory()
            .evaluate("sum(avg_over_time(temp[100s]))", steps, &budget())
            .expect("answers");
        let Value::Vector(v) = got.value else {
            panic!("a vector")
        };
        // Seconds 2910..=3000 (every 10 s): t/10 = 291..=300, so the means
        // are 295.5 and twice that.
        assert_eq!(v[0].values, vec![Some(295.5 * 3.0)]);
    }

    #[test]
    fn budgets_are_counted_as_the_store_counts_them() {
        let steps = Steps::new(0, 5_990_000, 1000);
        let small = Budget {
            max_samples: 10_000,
            ..budget()
        };
        let err = memory()
            .evaluate("temp", steps, &small)
            .expect_err("too many");
        assert!(format!("{err}").contains("query.max_samples"), "{err}");
        let few = Budget {
            max_series: 1,
            ..budget()
        };
        let err = memory()
            .evaluate("temp", Steps::new(0, 0, 1), &few)
            .expect_err("too many");
        assert!(format!("{err}").contains("query.max_series"), "{err}");
    }

    /// The 1 KB line: 30 `count_values` of a vector joined by the
    /// right-associative `^`. Each holds a series per distinct value (3 162
    /// of them, at 3 162 steps): every left side is held while the right is
    /// computed. Charged as it is built, it stops at the budget.
    #[test]
    fn a_chain_of_count_values_stops_at_the_querys_memory_budget() {
        let terms: Vec<String> = (0..30)
            .map(|i| format!("count_values(\"a{i}\",vector(time()))"))
            .collect();
        let query = terms.join(" ^ ");
        assert!(query.len() < 1100, "{}", query.len());
        let steps = Steps::new(1_000_000_000_000, 1_000_003_161_000, 1000);
        let budget = Budget {
            max_samples: 100_000_000,
            max_memory: 256 << 20,
            ..budget()
        };
        match Memory::default().evaluate(&query, steps, &budget) {
            Err(PromError::Execution(m)) => {
                assert!(m.contains("query.max_memory_per_query"), "{m}")
            }
            other => panic!("refused at the budget: {:?}", other.map(|o| o.value.kind())),
        }
        // One term fits in 1 GiB (3 162 series of 3 162 values, about
        // 170 MB, and three times that to write the answer out).
        let roomy = Budget {
            max_memory: 1 << 30,
            ..budget
        };
        let one = Memory::default()
            .evaluate(&terms[0], steps, &roomy)
            .expect("one term fits");
        let Value::Vector(v) = one.value else {
            panic!("a vector")
        };
        assert_eq!(v.len(), 3162);
    }
}

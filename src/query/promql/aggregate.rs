//! Aggregation operators over all steps at once, with Prometheus 3's
//! arithmetic: compensated sums, Welford's variance, quantiles between
//! ranks, and `topk`/`bottomk` choosing among ties as its heap does. Pure.

use std::collections::BTreeMap;

use super::ast::{AggOp, Grouping};
use super::budget::{self, Ledger};
use super::error::PromError;
use super::functions::quantile;
use super::value::{KahanSum, LabelSet, NAME, Series, format_value};

/// The labels a series is grouped by: `by (…)` keeps those, `without (…)`
/// drops them and `__name__`.
pub fn group_labels(labels: &LabelSet, grouping: &Grouping) -> LabelSet {
    match grouping {
        Grouping::By(keep) => labels
            .iter()
            .filter(|(k, _)| keep.iter().any(|g| g == *k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        Grouping::Without(drop) => labels
            .iter()
            .filter(|(k, _)| *k != NAME && !drop.iter().any(|g| g == *k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

/// What the aggregation's parameter is at each step.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    None,
    /// `topk`/`bottomk`'s k, `quantile`'s φ.
    Number(Vec<f64>),
    /// `count_values`' label.
    Label(String),
}

/// `op` over `input` (sorted by labels, as Prometheus' selectors answer)
/// at each of `n` steps. Only `count_values` can answer more values than it
/// was given (a series per distinct value): at most `max_values`.
/// Each new series is charged to `ledger` before it is built.
pub fn aggregate(
    op: AggOp,
    grouping: &Grouping,
    param: &Param,
    input: &[Series],
    n: usize,
    (max_values, ledger): (usize, &Ledger),
) -> Result<Vec<Series>, PromError> {
    match op {
        AggOp::Topk | AggOp::Bottomk => {
            ledger.reserve(budget::vector_bytes(input))?;
            select_k(op == AggOp::Topk, grouping, param, input, n)
        }
        AggOp::CountValues => count_values(grouping, param, input, n, (max_values, ledger)),
        _ => fold(op, grouping, param, input, n, ledger),
    }
}

/// The groups' members, in input order, by the groups' labels.
fn groups(input: &[Series], grouping: &Grouping) -> BTreeMap<LabelSet, Vec<usize>> {
    let mut groups: BTreeMap<LabelSet, Vec<usize>> = BTreeMap::new();
    for (i, s) in input.iter().enumerate() {
        groups
            .entry(group_labels(&s.labels, grouping))
            .or_default()
            .push(i);
    }
    groups
}

/// The aggregations to one value per group.
fn fold(
    op: AggOp,
    grouping: &Grouping,
    param: &Param,
    input: &[Series],
    n: usize,
    ledger: &Ledger,
) -> Result<Vec<Series>, PromError> {
    let mut buf: Vec<f64> = Vec::new();
    let groups = groups(input, grouping);
    ledger.reserve(
        groups
            .iter()
            .map(|(labels, members)| {
                budget::series_bytes(labels, n).saturating_add(members.len() * 8)
            })
            .fold(0usize, usize::saturating_add),
    )?;
    Ok(groups
        .into_iter()
        .map(|(labels, members)| {
            let values = (0..n)
                .map(|k| {
                    buf.clear();
                    buf.extend(members.iter().filter_map(|&i| input[i].values[k]));
                    if buf.is_empty() {
                        return None;
                    }
                    Some(match op {
                        AggOp::Sum => kahan(&buf).value(),
                        AggOp::Avg => kahan(&buf).value() / buf.len() as f64,
                        AggOp::Count => buf.len() as f64,
                        AggOp::Group => 1.0,
                        AggOp::Min => buf[1..]
                            .iter()
                            .fold(buf[0], |m, &x| if m > x || m.is_nan() { x } else { m }),
                        AggOp::Max => buf[1..]
                            .iter()
                            .fold(buf[0], |m, &x| if m < x || m.is_nan() { x } else { m }),
                        AggOp::Stddev => welford(&buf).sqrt(),
                        AggOp::Stdvar => welford(&buf),
                        AggOp::Quantile => {
                            let q = match param {
                                Param::Number(q) => q[k],
                                _ => f64::NAN,
                            };
                            quantile(q, &mut buf)
                        }
                        // Answered by their own functions.
                        AggOp::Topk | AggOp::Bottomk | AggOp::CountValues => f64::NAN,
                    })
                })
                .collect();
            Series { labels, values }
        })
        .filter(|s| s.values.iter().any(Option::is_some))
        .collect())
}

fn kahan(xs: &[f64]) -> KahanSum {
    let mut k = KahanSum::default();
    for &x in xs {
        k.add(x);
    }
    k
}

/// The population variance as Prometheus' aggregation computes it.
fn welford(xs: &[f64]) -> f64 {
    let (mut count, mut mean, mut m2) = (0.0f64, 0.0f64, 0.0f64);
    for &x in xs {
        count += 1.0;
        let delta = x - mean;
        mean += delta / count;
        m2 += delta * (x - mean);
    }
    m2 / count
}

/// `count_values("label", v)`: per group, how many series hold each value.
fn count_values(
    grouping: &Grouping,
    param: &Param,
    input: &[Series],
    n: usize,
    (max_values, ledger): (usize, &Ledger),
) -> Result<Vec<Series>, PromError> {
    let Param::Label(label) = param else {
        return Err(PromError::BadData(
            "count_values takes a label name as its first argument".into(),
        ));
    };
    if !valid_label_name(label) {
        return Err(PromError::Execution(format!(
            "invalid label name {label:?}"
        )));
    }
    // The value label is one of the grouping labels (with `by`, as Prometheus adds it).
    let grouping = match grouping {
        Grouping::By(keep) => {
            let mut keep = keep.clone();
            keep.push(label.clone());
            Grouping::By(keep)
        }
        Grouping::Without(drop) => Grouping::Without(drop.clone()),
    };
    let mut out: BTreeMap<LabelSet, Vec<Option<f64>>> = BTreeMap::new();
    for k in 0..n {
        for s in input {
            let Some(v) = s.values[k] else { continue };
            let mut labels = s.labels.clone();
            labels.insert(label.clone(), format_value(v));
            let key = group_labels(&labels, &grouping);
            if !out.contains_key(&key) {
                if (out.len() + 1).saturating_mul(n) > max_values {
                    return Err(PromError::BadData(format!(
                        "count_values would answer more than {max_values} values (query.max_samples): a series for each distinct value"
                    )));
                }
                ledger.reserve(budget::series_bytes(&key, n))?;
            }
            let slot = &mut out.entry(key).or_insert_with(|| vec![None; n])[k];
            *slot = Some(slot.unwrap_or(0.0) + 1.0);
        }
    }
    Ok(out
        .into_iter()
        .map(|(labels, values)| Series { labels, values })
        .collect())
}

/// Prometheus' label names: `[a-zA-Z_][a-zA-Z0-9_]*`.
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `topk`/`bottomk`: the series themselves, each at the steps where it was
/// among the k of its group.
fn select_k(
    top: bool,
    grouping: &Grouping,
    param: &Param,
    input: &[Series],
    n: usize,
) -> Result<Vec<Series>, PromError> {
    let Param::Number(ks) = param else {
        return Err(PromError::BadData("topk and bottomk take k first".into()));
    };
    let groups = groups(input, grouping);
    let mut out: Vec<Series> = input
        .iter()
        .map(|s| Series {
            labels: s.labels.clone(),
            values: vec![None; n],
        })
        .collect();
    for (k, &want) in ks.iter().enumerate().take(n) {
        if want.is_nan() {
            return Err(PromError::Execution("Parameter value is NaN".into()));
        }
        if want < 1.0 {
            continue;
        }
        // Go's int64 conversion truncates, and k beyond the input is the input.
        let want = if want >= input.len() as f64 {
            input.len()
        } else {
            want as usize
        };
        for members in groups.values() {
            let mut heap = GoHeap {
                top,
                items: Vec::with_capacity(want.min(members.len())),
            };
            for &i in members {
                let Some(v) = input[i].values[k] else {
                    continue;
                };
                heap.offer(want, (i, v));
            }
            for (i, v) in heap.items {
                out[i].values[k] = Some(v);
            }
        }
    }
    out.retain(|s| s.values.iter().any(Option::is_some));
    Ok(out)
}

/// Prometheus' `vectorByValueHeap` (or its reverse) driven as
/// `aggregationK` drives it through Go's `container/heap`: ties go to the
/// series met first, in the heap's own order.
struct GoHeap {
    top: bool,
    items: Vec<(usize, f64)>,
}

impl GoHeap {
    fn less(&self, i: usize, j: usize) -> bool {
        let (vi, vj) = (self.items[i].1, self.items[j].1);
        if vi.is_nan() {
            return true;
        }
        if self.top { vi < vj } else { vi > vj }
    }

    fn offer(&mut self, k: usize, x: (usize, f64)) {
        if self.items.len() < k {
            self.items.push(x);
            self.up(self.items.len() - 1);
            return;
        }
        let head = self.items[0].1;
        let better = if self.top { head < x.1 } else { head > x.1 };
        if better || (head.is_nan() && !x.1.is_nan()) {
            self.items[0] = x;
            if k > 1 && !self.down(0) {
                self.up(0);
            }
        }
    }

    fn up(&mut self, mut j: usize) {
        while j > 0 {
            let i = (j - 1) / 2;
            if !self.less(j, i) {
                break;
            }
            self.items.swap(i, j);
            j = i;
        }
    }

    fn down(&mut self, i0: usize) -> bool {
        let n = self.items.len();
        let mut i = i0;
        loop {
            let j1 = 2 * i + 1;
            if j1 >= n {
                break;
            }
            let mut j = j1;
            if j1 + 1 < n && self.less(j1 + 1, j1) {
                j = j1 + 1;
            }
            if !self.less(j, i) {
                break;
            }
            self.items.swap(i, j);
            i = j;
        }
        i > i0
    }
}

#[cfg(test)]
mod tests {
    use super::super::value::series;
    use super::*;

    fn input() -> Vec<Series> {
        vec![
            series(
                &[("__name__", "t"), ("sensor", "a"), ("site", "x")],
                &[Some(1.0), None],
            ),
            series(
                &[("__name__", "t"), ("sensor", "b"), ("site", "x")],
                &[Some(3.0), Some(5.0)],
            ),
            series(&[("__name__", "t"), ("sensor", "c")], &[Some(10.0), None]),
        ]
    }

    #[test]
    fn aggregations_group_and_drop_labels_like_prometheus() {
        let by_site = Grouping::By(vec!["site".into()]);
        let out = aggregate(
            AggOp::Avg,
            &by_site,
            &Param::None,
            &input(),
            2,
            (usize::MAX, &Ledger::unlimited()),
        )
        .expect("ok");
        assert_eq!(
            out,
            vec![
                series(&[], &[Some(10.0), None]),
                series(&[("site", "x")], &[Some(2.0), Some(5.0)]),
            ]
        );
        let without = Grouping::Without(vec!["sensor".into()]);
        let out = aggregate(
            AggOp::Count,
            &without,
            &Param::None,
            &input(),
            2,
            (usize::MAX, &Ledger::unlimited()),
        )
        .expect("ok");
        assert_eq!(out[1], series(&[("site", "x")], &[Some(2.0), Some(1.0)]));
        let all = Grouping::By(Vec::new());
        let out = aggregate(
            AggOp::Max,
            &all,
            &Param::None,
            &input(),
            2,
            (usize::MAX, &Ledger::unlimited()),
        )
        .expect("ok");
        assert_eq!(out, vec![series(&[], &[Some(10.0), Some(5.0)])]);
        let out = aggregate(
            AggOp::Stdvar,
            &all,
            &Param::None,
            &input(),
            2,
            (usize::MAX, &Ledger::unlimited()),
        )
        .expect("ok");
        // Population variance of 1, 3, 10: mean 14/3.
        let want = ((1.0f64 - 14.0 / 3.0).powi(2)
            + (3.0f64 - 14.0 / 3.0).powi(2)
            + (10.0f64 - 14.0 / 3.0).powi(2))
            / 3.0;
        assert!((out[0].values[0].expect("a value") - want).abs() < 1e-12);
        assert_eq!(out[0].values[1], Some(0.0));
    }

    #[test]
    fn topk_keeps_whole_series_and_breaks_ties_by_input_order() {
        let tied: Vec<Series> = ["a", "b", "c", "d"]
            .iter()
            .map(|s| series(&[("__name__", "t"), ("sensor", s)], &[Some(1.0)]))
            .collect();
        let all = Grouping::By(Vec::new());
        let out = aggregate(
            AggOp::Topk,
            &all,
            &Param::Number(vec![2.0]),
            &tied,
            1,
            (usize::MAX, &Ledger::unlimited()),
        )
        .expect("ok");
        let names: Vec<&str> = out.iter().map(|s| s.labels["sensor"].as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(out[0].labels["__name__"], "t");
        let mut mixed = tied.clone();
        mixed[2].values[0] = Some(5.0);
        let out = aggregate(
            AggOp::Bottomk,
            &all,
            &Param::Number(vec![1.0]),
            &mixed,
            1,
            (usize::MAX, &Ledger::unlimited()),
        )
        .expect("ok");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].labels["sensor"], "a");
        // c replaces a at the head, then sinks below b: b and c, as Go's
        // heap leaves them (a, met first, is not kept).
        let out = aggregate(
            AggOp::Topk,
            &all,
            &Param::Number(vec![2.0]),
            &mixed,
            1,
            (usize::MAX, &Ledger::unlimited()),
        )
        .expect("ok");
        let names: Vec<&str> = out.iter().map(|s| s.labels["sensor"].as_str()).collect();
        assert_eq!(names, ["b", "c"]);
        assert!(
            aggregate(
                AggOp::Topk,
                &all,
                &Param::Number(vec![0.5]),
                &mixed,
                1,
                (usize::MAX, &Ledger::unlimited())
            )
            .expect("ok")
            .is_empty()
        );
    }

    #[test]
    fn count_values_counts_each_value_under_the_label() {
        let s = vec![
            series(&[("sensor", "a")], &[Some(1.0)]),
            series(&[("sensor", "b")], &[Some(1.0)]),
            series(&[("sensor", "c")], &[Some(2.5)]),
        ];
        let out = aggregate(
            AggOp::CountValues,
            &Grouping::By(Vec::new()),
            &Param::Label("v".into()),
            &s,
            1,
            (usize::MAX, &Ledger::unlimited()),
        )
        .expect("ok");
        assert_eq!(
            out,
            vec![
                series(&[("v", "1")], &[Some(2.0)]),
                series(&[("v", "2.5")], &[Some(1.0)]),
            ]
        );
        assert!(
            aggregate(
                AggOp::CountValues,
                &Grouping::By(Vec::new()),
                &Param::Label("1x".into()),
                &s,
                1,
                (usize::MAX, &Ledger::unlimited())
            )
            .is_err()
        );
        // A series per distinct value: two of them, at one step each, are
        // more than one value.
        let err = aggregate(
            AggOp::CountValues,
            &Grouping::By(Vec::new()),
            &Param::Label("v".into()),
            &s,
            1,
            (1, &Ledger::unlimited()),
        )
        .expect_err("too many");
        assert!(format!("{err}").contains("query.max_samples"), "{err}");
    }
}

//! Values of a PromQL evaluation over all steps at once, and the operations
//! on them with Prometheus' semantics: which results keep `__name__`, how
//! groups form, Kahan-compensated sums (as Prometheus 3). Pure.

use std::collections::BTreeMap;

use super::PromError;
use super::compile::{AggOp, ArithOp, Grouping, Node};

/// Label name to value, sorted (Prometheus' order), `__name__` included.
pub type LabelSet = BTreeMap<String, String>;

pub const NAME: &str = "__name__";

/// One series: a value (or none) at every step.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: LabelSet,
    pub values: Vec<Option<f64>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A value at every step.
    Scalar(Vec<f64>),
    /// Sorted by labels; series without any value are left out.
    Vector(Vec<Series>),
}

/// Evaluates `node` over `n` steps, taking each leaf's series from `leaves`.
pub fn run(node: &Node, leaves: &mut [Vec<Series>], n: usize) -> Result<Value, PromError> {
    Ok(match node {
        Node::Number(x) => Value::Scalar(vec![*x; n]),
        Node::Leaf(i) => vector(std::mem::take(&mut leaves[*i]))?,
        Node::Neg(e) => match run(e, leaves, n)? {
            Value::Scalar(v) => Value::Scalar(v.into_iter().map(|x| -x).collect()),
            Value::Vector(s) => vector(map_values(s, |x| -x))?,
        },
        Node::Arith { op, lhs, rhs } => match (run(lhs, leaves, n)?, run(rhs, leaves, n)?) {
            (Value::Scalar(a), Value::Scalar(b)) => {
                Value::Scalar(a.iter().zip(&b).map(|(&x, &y)| op.apply(x, y)).collect())
            }
            (Value::Vector(v), Value::Scalar(s)) => vector(with_scalar(v, &s, *op, false))?,
            (Value::Scalar(s), Value::Vector(v)) => vector(with_scalar(v, &s, *op, true))?,
            (Value::Vector(_), Value::Vector(_)) => {
                return Err(PromError::BadData(
                    "operations between two vectors are not supported".into(),
                ));
            }
        },
        Node::Aggregate { op, grouping, expr } => match run(expr, leaves, n)? {
            Value::Vector(s) => Value::Vector(aggregate(*op, grouping, &s, n)),
            Value::Scalar(_) => {
                return Err(PromError::BadData(
                    "aggregations expect an instant vector".into(),
                ));
            }
        },
    })
}

/// Sorted, without empty series, and refusing two series with one label set
/// (as Prometheus does once `__name__` is dropped).
fn vector(mut s: Vec<Series>) -> Result<Value, PromError> {
    s.retain(|x| x.values.iter().any(Option::is_some));
    s.sort_by(|a, b| a.labels.cmp(&b.labels));
    if s.windows(2).any(|w| w[0].labels == w[1].labels) {
        return Err(PromError::Execution(
            "vector cannot contain metrics with the same labelset".into(),
        ));
    }
    Ok(Value::Vector(s))
}

fn map_values(s: Vec<Series>, f: impl Fn(f64) -> f64) -> Vec<Series> {
    s.into_iter()
        .map(|mut x| {
            x.labels.remove(NAME);
            for v in x.values.iter_mut().flatten() {
                *v = f(*v);
            }
            x
        })
        .collect()
}

fn with_scalar(v: Vec<Series>, s: &[f64], op: ArithOp, scalar_first: bool) -> Vec<Series> {
    v.into_iter()
        .map(|mut x| {
            x.labels.remove(NAME);
            for (v, &y) in x.values.iter_mut().zip(s) {
                if let Some(v) = v {
                    *v = if scalar_first {
                        op.apply(y, *v)
                    } else {
                        op.apply(*v, y)
                    };
                }
            }
            x
        })
        .collect()
}

/// Neumaier's compensated sum, as Prometheus' `kahanSumInc`.
#[derive(Debug, Clone, Copy, Default)]
struct KahanSum {
    sum: f64,
    c: f64,
}

impl KahanSum {
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if t.is_infinite() {
            self.c = 0.0;
        } else if self.sum.abs() >= x.abs() {
            self.c += (self.sum - t) + x;
        } else {
            self.c += (x - t) + self.sum;
        }
        self.sum = t;
    }

    fn value(&self) -> f64 {
        self.sum + self.c
    }
}

#[derive(Debug, Clone, Copy)]
struct Group {
    count: u64,
    sum: KahanSum,
    value: f64,
}

fn group_labels(labels: &LabelSet, grouping: &Grouping) -> LabelSet {
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

fn aggregate(op: AggOp, grouping: &Grouping, input: &[Series], n: usize) -> Vec<Series> {
    let mut groups: BTreeMap<LabelSet, Vec<usize>> = BTreeMap::new();
    for (i, s) in input.iter().enumerate() {
        groups
            .entry(group_labels(&s.labels, grouping))
            .or_default()
            .push(i);
    }
    groups
        .into_iter()
        .map(|(labels, members)| {
            let values = (0..n)
                .map(|k| {
                    let mut g: Option<Group> = None;
                    for &i in &members {
                        let Some(x) = input[i].values[k] else {
                            continue;
                        };
                        match &mut g {
                            None => {
                                let mut sum = KahanSum::default();
                                sum.add(x);
                                g = Some(Group {
                                    count: 1,
                                    sum,
                                    value: x,
                                });
                            }
                            Some(g) => {
                                g.count += 1;
                                g.sum.add(x);
                                match op {
                                    AggOp::Min if g.value > x || g.value.is_nan() => g.value = x,
                                    AggOp::Max if g.value < x || g.value.is_nan() => g.value = x,
                                    _ => {}
                                }
                            }
                        }
                    }
                    g.map(|g| match op {
                        AggOp::Sum => g.sum.value(),
                        AggOp::Avg => g.sum.value() / g.count as f64,
                        AggOp::Count => g.count as f64,
                        AggOp::Min | AggOp::Max => g.value,
                    })
                })
                .collect();
            Series { labels, values }
        })
        .filter(|s| s.values.iter().any(Option::is_some))
        .collect()
}

/// A sample value as Prometheus writes it: Go's shortest `'f'` format.
pub fn format_value(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x == f64::INFINITY {
        "+Inf".into()
    } else if x == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        x.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::super::compile::compile;
    use super::*;

    fn series(labels: &[(&str, &str)], values: &[Option<f64>]) -> Series {
        Series {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            values: values.to_vec(),
        }
    }

    fn eval(q: &str, leaves: Vec<Vec<Series>>, n: usize) -> Result<Value, PromError> {
        let (node, _) = compile(q).expect("compiles");
        let mut leaves = leaves;
        run(&node, &mut leaves, n)
    }

    #[test]
    fn aggregations_group_and_drop_labels_like_prometheus() {
        let input = vec![
            series(
                &[("__name__", "t"), ("sensor", "a"), ("site", "x")],
                &[Some(1.0), None],
            ),
            series(
                &[("__name__", "t"), ("sensor", "b"), ("site", "x")],
                &[Some(3.0), Some(5.0)],
            ),
            series(&[("__name__", "t"), ("sensor", "c")], &[Some(10.0), None]),
        ];
        let Value::Vector(out) = eval("avg by (site) (t)", vec![input.clone()], 2).expect("ok")
        else {
            panic!("vector")
        };
        assert_eq!(
            out,
            vec![
                series(&[], &[Some(10.0), None]),
                series(&[("site", "x")], &[Some(2.0), Some(5.0)]),
            ]
        );
        let Value::Vector(out) =
            eval("count without (sensor) (t)", vec![input.clone()], 2).expect("ok")
        else {
            panic!("vector")
        };
        assert_eq!(out[1], series(&[("site", "x")], &[Some(2.0), Some(1.0)]));
        let Value::Vector(out) = eval("max(t)", vec![input], 2).expect("ok") else {
            panic!("vector")
        };
        assert_eq!(out, vec![series(&[], &[Some(10.0), Some(5.0)])]);
    }

    #[test]
    fn arithmetic_drops_the_name_and_keeps_gaps() {
        let input = vec![series(
            &[("__name__", "t"), ("sensor", "a")],
            &[Some(10.0), None],
        )];
        let Value::Vector(out) = eval("t * 1.8 + 32", vec![input.clone()], 2).expect("ok") else {
            panic!("vector")
        };
        assert_eq!(out, vec![series(&[("sensor", "a")], &[Some(50.0), None])]);
        let Value::Vector(out) = eval("100 - t", vec![input], 2).expect("ok") else {
            panic!("vector")
        };
        assert_eq!(out[0].values, vec![Some(90.0), None]);
        assert_eq!(
            eval("2 ^ 3 % 5", vec![], 1).expect("ok"),
            Value::Scalar(vec![3.0])
        );
    }

    #[test]
    fn equal_label_sets_after_dropping_the_name_are_an_error() {
        let input = vec![
            series(&[("__name__", "a"), ("sensor", "s")], &[Some(1.0)]),
            series(&[("__name__", "b"), ("sensor", "s")], &[Some(2.0)]),
        ];
        assert!(matches!(
            eval(r#"-{__name__=~"a|b"}"#, vec![input], 1),
            Err(PromError::Execution(_))
        ));
    }

    #[test]
    fn compensated_sums_survive_cancellation() {
        let mut k = KahanSum::default();
        for x in [1e16, 1.0, -1e16] {
            k.add(x);
        }
        assert_eq!(k.value(), 1.0);
    }

    #[test]
    fn values_are_written_as_prometheus_writes_them() {
        assert_eq!(format_value(1e21), "1000000000000000000000");
        assert_eq!(format_value(0.1), "0.1");
        assert_eq!(format_value(-2.0), "-2");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NAN), "NaN");
    }
}

//! Values of a PromQL evaluation over all steps at once and what every
//! operation on them shares: label sets, dropping `__name__`, the check for
//! equal label sets, Kahan-compensated sums (as Prometheus 3). Pure.

use std::collections::BTreeMap;

use super::error::PromError;

/// Label name to value, sorted (Prometheus' order), `__name__` included.
pub type LabelSet = BTreeMap<String, String>;

pub const NAME: &str = "__name__";

/// One series: a value (or none) at every step.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: LabelSet,
    pub values: Vec<Option<f64>>,
}

/// A series from literals, for the evaluator's unit tests.
#[cfg(test)]
pub(super) fn series(labels: &[(&str, &str)], values: &[Option<f64>]) -> Series {
    Series {
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        values: values.to_vec(),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A value at every step.
    Scalar(Vec<f64>),
    /// Sorted by labels; series without any value are left out.
    Vector(Vec<Series>),
    /// A string literal (an argument of `label_replace` and friends).
    String(String),
}

impl Value {
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Scalar(_) => "scalar",
            Value::Vector(_) => "instant vector",
            Value::String(_) => "string",
        }
    }
}

/// Sorted, without empty series, and refusing two series with one label set
/// (as Prometheus does once `__name__` is dropped).
pub fn vector(mut s: Vec<Series>) -> Result<Value, PromError> {
    s.retain(|x| x.values.iter().any(Option::is_some));
    s.sort_by(|a, b| a.labels.cmp(&b.labels));
    if s.windows(2).any(|w| w[0].labels == w[1].labels) {
        return Err(PromError::Execution(
            "vector cannot contain metrics with the same labelset".into(),
        ));
    }
    Ok(Value::Vector(s))
}

/// Every value mapped, `__name__` dropped (as Prometheus' functions do).
pub fn map_values(s: Vec<Series>, f: impl Fn(f64) -> f64) -> Vec<Series> {
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

/// Neumaier's compensated sum, as Prometheus' `kahanSumInc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct KahanSum {
    sum: f64,
    c: f64,
}

impl KahanSum {
    pub fn add(&mut self, x: f64) {
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

    pub fn value(&self) -> f64 {
        self.sum + self.c
    }
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
    use super::*;

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

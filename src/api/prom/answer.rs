//! Prometheus' answers as types, serialised as Prometheus writes them:
//! sample values as strings (`"+Inf"`, `"NaN"`, Go's shortest form),
//! timestamps as seconds with milliseconds when there are any.

use serde::ser::{Serialize, SerializeTuple, Serializer};

use crate::query::promql::{LabelSet, Series, Steps, Value, format_value};

/// Milliseconds since the epoch, written as seconds with a fraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Time(pub i64);

impl Time {
    /// As Prometheus writes it: `1700000000`, `1700000000.050`, `-1.500`.
    pub fn text(self) -> String {
        let ms = self.0;
        let (secs, frac) = (ms.div_euclid(1000), ms.rem_euclid(1000));
        if ms < 0 && frac != 0 {
            // -1.5 s: the magnitude with a sign, as Go writes it.
            let m = -ms;
            return format!("-{}.{:03}", m / 1000, m % 1000);
        }
        if frac != 0 {
            format!("{secs}.{frac:03}")
        } else {
            secs.to_string()
        }
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw = serde_json::value::RawValue::from_string(self.text())
            .map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

/// A sample: `[time, "value"]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point(pub Time, pub f64);

impl Serialize for Point {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&self.0)?;
        t.serialize_element(&format_value(self.1))?;
        t.end()
    }
}

#[derive(Debug, serde::Serialize)]
pub struct Sample<'a> {
    pub metric: &'a LabelSet,
    pub value: Point,
}

#[derive(Debug, serde::Serialize)]
pub struct Range<'a> {
    pub metric: &'a LabelSet,
    pub values: Vec<Point>,
}

/// `data` of a query: `{"resultType": …, "result": …}`.
#[derive(Debug, serde::Serialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
pub enum QueryData<'a> {
    Scalar(Point),
    Vector(Vec<Sample<'a>>),
    Matrix(Vec<Range<'a>>),
}

/// `{"status": "success", "data": …}`, with warnings when there are any.
#[derive(Debug, serde::Serialize)]
pub struct Success<T> {
    pub status: &'static str,
    pub data: T,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<&'static str>,
}

impl<T> Success<T> {
    pub fn new(data: T) -> Self {
        Self {
            status: "success",
            data,
            warnings: Vec::new(),
        }
    }
}

/// `{"status": "error", "errorType": …, "error": …}`.
#[derive(Debug, serde::Serialize)]
pub struct Error<'a> {
    pub status: &'static str,
    #[serde(rename = "errorType")]
    pub kind: &'a str,
    pub error: &'a str,
}

/// An evaluation's result: a range query's matrix (a scalar becomes a
/// series without labels), or an instant query's vector or scalar.
pub fn query_data<'a>(
    value: &'a Value,
    steps: &Steps,
    instant: bool,
    empty: &'a LabelSet,
) -> QueryData<'a> {
    match (value, instant) {
        (Value::Scalar(v), true) => QueryData::Scalar(Point(
            Time(steps.at(0)),
            v.first().copied().unwrap_or(f64::NAN),
        )),
        (Value::Vector(series), true) => QueryData::Vector(
            series
                .iter()
                .filter_map(|s| {
                    let v = (*s.values.first()?)?;
                    Some(Sample {
                        metric: &s.labels,
                        value: Point(Time(steps.at(0)), v),
                    })
                })
                .collect(),
        ),
        (Value::Vector(series), false) => {
            QueryData::Matrix(series.iter().map(|s| matrix(s, steps)).collect())
        }
        // `promql::evaluate` answers no strings.
        (Value::String(_), _) => QueryData::Vector(Vec::new()),
        (Value::Scalar(v), false) => QueryData::Matrix(vec![Range {
            metric: empty,
            values: v
                .iter()
                .enumerate()
                .map(|(k, &x)| Point(Time(steps.at(k)), x))
                .collect(),
        }]),
    }
}

fn matrix<'a>(s: &'a Series, steps: &Steps) -> Range<'a> {
    Range {
        metric: &s.labels,
        values: s
            .values
            .iter()
            .enumerate()
            .filter_map(|(k, v)| v.map(|x| Point(Time(steps.at(k)), x)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_written_as_prometheus_writes_them() {
        let texts: Vec<String> = [1_700_000_000_000, 1_700_000_000_050, -1_500]
            .into_iter()
            .map(|ms| Time(ms).text())
            .collect();
        assert_eq!(texts, ["1700000000", "1700000000.050", "-1.500"]);
    }

    #[test]
    fn results_have_prometheus_shapes() {
        let steps = Steps::new(1000, 3000, 1000);
        let labels: LabelSet = [("sensor".to_owned(), "a".to_owned())].into();
        let empty = LabelSet::new();
        let v = Value::Vector(vec![Series {
            labels,
            values: vec![Some(1.5), None, Some(2.0)],
        }]);
        assert_eq!(
            serde_json::to_string(&query_data(&v, &steps, false, &empty)).expect("json"),
            r#"{"resultType":"matrix","result":[{"metric":{"sensor":"a"},"values":[[1,"1.5"],[3,"2"]]}]}"#
        );
        let one = Steps::new(1000, 1000, 1);
        let scalar = Value::Scalar(vec![2.0]);
        assert_eq!(
            serde_json::to_string(&Success::new(query_data(&scalar, &one, true, &empty)))
                .expect("json"),
            r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#
        );
    }
}

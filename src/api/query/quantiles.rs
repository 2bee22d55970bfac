//! Percentiles from rollups (`quantiles=0.5,0.95,0.99`): each point's
//! readings' sketch, merged from whole rollup slots and buckets' values
//! (`query::plan`'s `Need::Sketches`), answers each quantile within
//! `buckets.sketch_accuracy` of the exact one.

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::Point;
use super::evaluation::evaluate_figures;
use super::range::Range;
use crate::api::params::Params;
use crate::api::{ApiError, AppState};
use crate::domain::{MetricName, Sketch};
use crate::query::{Grid, Series};

/// Quantiles one request may ask for.
const MAX_QUANTILES: usize = 10;

/// The quantiles asked, in the order asked, each with its key in answers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Quantiles(Vec<(f64, String)>);

/// `quantiles=`: none when absent.
pub(crate) fn quantiles(params: &Params) -> Result<Option<Quantiles>, ApiError> {
    let Some(list) = params.get("quantiles") else {
        return Ok(None);
    };
    let mut out: Vec<(f64, String)> = Vec::new();
    for text in list.split(',') {
        let q: f64 = text
            .trim()
            .parse()
            .ok()
            .filter(|q: &f64| (0.0..=1.0).contains(q))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "quantiles: {text:?} is not a number from 0 to 1 (quantiles=0.5,0.95,0.99)"
                ))
            })?;
        if out.iter().any(|(x, _)| *x == q) {
            return Err(ApiError::bad_request(format!(
                "quantiles: {q} is asked twice"
            )));
        }
        out.push((q, q.to_string()));
    }
    if out.len() > MAX_QUANTILES {
        return Err(ApiError::bad_request(format!(
            "quantiles: at most {MAX_QUANTILES} a request"
        )));
    }
    Ok(Some(Quantiles(out)))
}

impl Quantiles {
    /// The CSV columns: `q<quantile>` each.
    pub(crate) fn columns(&self) -> Vec<String> {
        self.0.iter().map(|(_, k)| format!("q{k}")).collect()
    }

    /// Each point's quantiles from its sketch (`null` without readings).
    pub(crate) fn annotate(&self, points: &mut [Point], sketches: &[Option<Sketch>]) {
        for (p, k) in points.iter_mut().zip(sketches) {
            p.quantiles = Some(QuantileValues(
                self.0
                    .iter()
                    .map(|(q, key)| (key.clone(), k.as_ref().and_then(|k| k.quantile(*q))))
                    .collect(),
            ));
        }
    }
}

/// Each group's points' sketches when quantiles are asked (none else): for
/// a route whose other figures come from another evaluation (time weighting).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn sketches(
    state: &AppState,
    endpoint: &str,
    metric: &MetricName<'_>,
    r: &Range,
    grid: &Grid,
    series: &[(Series<'_>, usize)],
    groups: usize,
    asked: Option<&Quantiles>,
) -> Result<Vec<Vec<Option<Sketch>>>, ApiError> {
    if asked.is_none() {
        return Ok(Vec::new());
    }
    let f = evaluate_figures(
        state,
        endpoint,
        metric,
        r,
        grid.clone(),
        series,
        groups,
        true,
    )
    .await?;
    Ok(f.sketches)
}

/// A point's quantiles, by quantile, in the order asked: a JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantileValues(pub Vec<(String, Option<f64>)>);

impl Serialize for QuantileValues {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(q: &str) -> Result<Option<Quantiles>, ApiError> {
        let raw = format!("quantiles={q}");
        let params = Params::parse(Some(&raw), &["quantiles"], false).expect("parses");
        quantiles(&params)
    }

    #[test]
    fn quantiles_are_numbers_from_zero_to_one_each_asked_once() {
        let q = parse("0.5,0.95,1,0").expect("valid").expect("asked");
        assert_eq!(q.columns(), ["q0.5", "q0.95", "q1", "q0"]);
        for bad in [
            "",
            "1.5",
            "-0.1",
            "p95",
            "0.5,0.5",
            "NaN",
            "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,0.91,0.92",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let none = Params::parse(None, &["quantiles"], false).expect("parses");
        assert_eq!(quantiles(&none).expect("valid"), None);
    }

    #[test]
    fn points_without_readings_answer_null_and_keys_keep_the_order_asked() {
        let q = parse("0.99,0.5").expect("valid").expect("asked");
        let mut k = Sketch::new(0.01).expect("valid");
        for v in 1..=100 {
            k.add(f64::from(v));
        }
        let agg = crate::domain::Agg::default();
        let mut points = vec![Point::new(None, &agg), Point::new(None, &agg)];
        q.annotate(&mut points, &[Some(k), None]);
        let json = serde_json::to_string(&points[0].quantiles).expect("json");
        assert!(json.starts_with("{\"0.99\":"), "{json}");
        let p50 = points[0].quantiles.as_ref().expect("set").0[1]
            .1
            .expect("a value");
        assert!((p50 - 50.0).abs() <= 0.5, "{p50}");
        assert_eq!(
            serde_json::to_string(&points[1].quantiles).expect("json"),
            "{\"0.99\":null,\"0.5\":null}"
        );
    }
}
